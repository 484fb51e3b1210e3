"""Defaults shared by the strategies of :mod:`.parallel` (torch-free: the config checks their options
without torch) and the torch modules that apply them (:mod:`.collectives`, :mod:`.fsdp`)."""

DEFAULT_BUCKET_MB = 25.0  # torch DDP's default bucket size (gradients reduced per all-reduce)
