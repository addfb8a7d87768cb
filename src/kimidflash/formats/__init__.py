"""What the recipe reads and writes on disk, below every feature that uses it: FP8 number
formats, the KV scales file, a DFlash drafter's shape and its vLLM checkpoint, an EAGLE-3
head's checkpoint. Serve's rules, the FP8 tools, the trainer and the CPU reference's
generators all stand on these modules, and they import nothing above `errors`, `fsio`,
`checkpoint_layout` and `eagle3`, so no feature needs another to read a file."""
