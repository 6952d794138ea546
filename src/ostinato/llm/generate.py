"""Generation over a program made by ``export_causal_lm``: prefill once, then one decode step per token.

Tokens, positions and the stop flags stay on the executable's device: the loop writes the sampled
token into the next step's input and advances the position in place, so a step needs no host sync
(with ``compile(..., replay=True)`` each decode step is one replay of the captured plan). The host
looks at the device only where the caller asks it to: a callback or the ``stream`` iterator receives
each step's tokens (as device tensors: reading them syncs), stop tokens are checked every
``sync_every`` steps, and ``stats`` times the first token and the end.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator, Sequence

import torch

from ..errors import InputError, OstinatoError


def lm_info(exe) -> dict:
    info = exe.program.info.get("llm")
    if not isinstance(info, dict):
        raise OstinatoError("generate needs a program made by ostinato.llm.export_causal_lm (its decode graph "
                            "and prefill method); this one has no 'llm' record in its info")
    return info


def sample(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Next tokens [B] from last-position logits [B, V], on their device: argmax for temperature 0 (the
    first maximum, as transformers' greedy search), else softmax sampling over the top-k / nucleus."""
    if not temperature:
        return logits.argmax(dim=-1)
    x = logits.float() / temperature
    if top_k is not None and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = probs.cumsum(dim=-1) - probs > top_p
        x = torch.full_like(x, float("-inf")).scatter(-1, order, sorted_x.masked_fill(drop, float("-inf")))
    return torch.multinomial(torch.softmax(x, dim=-1), 1, generator=generator).squeeze(-1)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _prompt(ids, batch: int, device: torch.device) -> torch.Tensor:
    if not isinstance(ids, torch.Tensor):
        ids = torch.tensor([list(ids)] if ids and not isinstance(list(ids)[0], (list, tuple)) else ids)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.shape[1] < 1 or ids.dtype in (torch.float16, torch.bfloat16, torch.float32,
                                                           torch.float64):
        raise InputError(f"generate: ids must be integer token ids [batch, T] with T >= 1, got "
                         f"{ids.dtype}{list(ids.shape)}")
    if ids.shape[0] != batch:
        raise InputError(f"generate: the program was exported for batch {batch}, got ids of batch {ids.shape[0]}; "
                         f"export with export_causal_lm(..., batch={ids.shape[0]})")
    return ids.to(device=device, dtype=torch.long)


def _steps(exe, ids, max_new_tokens: int, temperature: float, top_k, top_p, seed, stop, session, sync_every: int,
           stats: dict | None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yields (tokens [B], finished [B]) per new token, all on the device; rows that finished before
    this step get the pad token. Ends after max_new_tokens or once every row finished (checked every
    ``sync_every`` steps)."""
    info = lm_info(exe)
    device = exe.device
    session = session or exe.session
    prompt = _prompt(ids, info["batch"], device)
    t = prompt.shape[1]
    if max_new_tokens < 1:
        raise InputError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
    if t + max_new_tokens > info["max_cache_len"]:
        raise InputError(f"generate: prompt ({t}) + max_new_tokens ({max_new_tokens}) exceeds the static cache "
                         f"of {info['max_cache_len']} positions; export with a larger max_cache_len")
    stop_ids = info.get("eos_token_ids", []) if stop is None else ([stop] if isinstance(stop, int) else list(stop))
    stop_t = torch.tensor(stop_ids, dtype=torch.long, device=device) if stop_ids else None
    pad = info.get("pad_token_id")
    pad = stop_ids[0] if pad is None and stop_ids else (pad or 0)
    generator = None
    if temperature:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed if seed is not None else torch.seed())
    t0 = time.perf_counter()

    # Prefill: the prompt in one call when the program has the method, else one decode step per token.
    if t >= 2 and "prefill" in exe.methods:
        logits = session.method("prefill")(prompt, torch.zeros(1, dtype=torch.long, device=device))
    else:
        for i in range(t):
            logits = session(prompt[:, i:i + 1].contiguous(), torch.full((1,), i, dtype=torch.long, device=device))
    token = sample(logits[:, -1, :], temperature, top_k, top_p, generator)
    finished = torch.zeros(prompt.shape[0], dtype=torch.bool, device=device)
    if stop_t is not None:
        finished = torch.isin(token, stop_t)
    if stats is not None:
        _synchronize(device)
        stats.update(prompt_tokens=t, ttft_s=time.perf_counter() - t0)
    yield token, finished

    step_ids = token[:, None].clone()              # the decode step's inputs, updated in place
    pos = torch.full((1,), t, dtype=torch.long, device=device)
    n = 1
    while n < max_new_tokens:
        if stop_t is not None and n % sync_every == 0 and bool(finished.all()):
            break
        logits = session(step_ids, pos)
        token = sample(logits[:, -1, :], temperature, top_k, top_p, generator)
        if stop_t is not None:
            token = torch.where(finished, torch.full_like(token, pad), token)
            finished = finished | torch.isin(token, stop_t)
        step_ids.copy_(token[:, None])
        pos.add_(1)
        n += 1
        yield token, finished
    if stats is not None:
        _synchronize(device)
        total = time.perf_counter() - t0
        stats.update(total_s=total, decode_s=total - stats["ttft_s"])


def generate(exe, ids, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, seed: int | None = None, stop: int | Sequence[int] | None = None, *,
             callback: Callable[[int, torch.Tensor], None] | None = None, session=None, sync_every: int = 8,
             stats: dict | None = None) -> torch.Tensor:
    """Generate up to ``max_new_tokens`` after the prompt ``ids`` ([batch, T] token ids, or a list of
    ids for batch 1); returns prompt and new tokens, ``[batch, T + n]``, on the executable's device.

    Greedy (``temperature=0``) by default; else sampling at ``temperature`` from the ``top_k`` most
    likely tokens and/or the ``top_p`` nucleus, with ``seed`` for a reproducible generator. ``stop``:
    token ids that end a row (None: the model's EOS ids recorded at export; ``[]``: never stop); a row
    that stopped is padded with the pad token (transformers' convention) until every row has, and the
    output ends at the step where the last row stopped. ``callback(step, tokens)`` gets each step's
    tokens [batch] as a device tensor; ``session`` runs on another session's state; ``stats`` (a dict)
    is filled with prompt_tokens, new_tokens, ttft_s, decode_s, total_s and decode_tokens_per_s.
    """
    tokens, flags = [], []
    for step, (token, finished) in enumerate(_steps(exe, ids, max_new_tokens, temperature, top_k, top_p, seed, stop,
                                                    session, sync_every, stats)):
        tokens.append(token)
        flags.append(finished)
        if callback is not None:
            callback(step, token)
    new = torch.stack(tokens, dim=1)
    done = torch.stack(flags, dim=1).all(dim=0)         # [n]: every row finished by this step
    if bool(done.any()):
        new = new[:, :int(done.int().argmax()) + 1]      # end at the step the last row stopped
    if stats is not None:
        stats["new_tokens"] = new.shape[1]
        stats["decode_tokens_per_s"] = (new.shape[1] - 1) / stats["decode_s"] if stats["decode_s"] > 0 else 0.0
    return torch.cat([_prompt(ids, new.shape[0], new.device), new], dim=1)


def stream(exe, ids, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
           top_p: float | None = None, seed: int | None = None, stop: int | Sequence[int] | None = None, *,
           session=None) -> Iterator[torch.Tensor]:
    """The new tokens as they are made: one device tensor [batch] per step, as ``generate`` makes them;
    ends when every row has stopped (checked each step: the iterator reads the flags) or after
    ``max_new_tokens``."""
    for token, finished in _steps(exe, ids, max_new_tokens, temperature, top_k, top_p, seed, stop, session, 1,
                                  None):
        yield token
        if bool(finished.all()):
            return
