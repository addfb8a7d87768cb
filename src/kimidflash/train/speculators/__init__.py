"""train.engine=speculators: the Kimi-scale drafter trainer, vllm-project/speculators, driven by our phases.

Our trainer stays the CPU and single-device engine. Where a drafter outgrows
one device (K2.6's: about 3.5B parameters over a 163840-token vocabulary), the
phases hand the work to speculators, which has FSDP2 under torchrun, flex-
attention block masks and a fused vocabulary loss, and reads hidden states
that vLLM's extract_hidden_states wrote. It lives in its own managed venv
(venv.py) and is only ever run as a command (cli.py), so its pins (torch,
transformers) never meet the project's.
"""
