"""The patch engine's parts (standard library only); ../patch_dflash_rocm.py is its
command line and documents the rules they implement.

common: exit codes, errors, markers, versions, hashes; spec: the patch set as
validated data and its hash; tree: the vllm package on disk; engine: each
patch's state and the staged edits; writer: writing a staged tree back.
"""
