"""Per-token log-prob, entropy and energy from hidden states, without materialising (N, V) logits.

The LM head's logits for N = B·T tokens and a 150k vocabulary are the largest tensor of an RL step
(T=32k: 20 GB in fp32, twice that with their gradient). Here they exist one chunk of tokens at a
time, in forward and again (recomputed) in backward; only per-token scalars are kept. Same idea as
the fused linear cross-entropy of Liger-Kernel (arXiv 2410.10989) and of Cut Your Losses
(arXiv 2411.09009), extended to entropy and energy.

For logits z = h·Wᵀ/τ, p = softmax(z), target y:
    logp   = z_y − logsumexp(z)               d logp/dz = onehot(y) − p
    H      = −Σ_v p_v log p_v                  dH/dz     = −p ∘ (log p + H)
    energy = −logsumexp(z)                     no gradient (ActFocus reads it from a frozen model)
"""

from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from swerl.algo._checks import check_number, check_tensor


class TokenStats(NamedTuple):
    logp: Tensor  # (B, T) log-prob of the target token, fp32 (or fp64 for fp64 inputs)
    entropy: Tensor | None  # (B, T) entropy of the token distribution; None if not computed
    energy: Tensor  # (B, T) −logsumexp(logits / temperature)


def _compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    # fp32 at least: bf16 logits lose ~0.1 nats at |z| ~ 20; fp64 inputs stay fp64 (gradcheck)
    out = torch.float32
    for dt in dtypes:
        out = torch.promote_types(out, dt)
    return out


_LOW_PRECISION = (torch.bfloat16, torch.float16)
_MM_OUT_DTYPE_OK = [True]  # cleared the first time torch.mm(..., out_dtype=) is unavailable


def _low_precision_path(hidden: Tensor, weight: Tensor) -> bool:
    """bf16/fp16 inputs on CUDA: tensor-core matmuls with fp32 accumulation and output.

    The (n, V) logits and their gradient stay fp32 elementwise; only the matmuls' operands are
    low precision: the inputs themselves (exact) and, in backward, the fp32 logit gradient rounded
    once to the input dtype (relative error 2⁻⁹ for bf16, below the final bf16 rounding of the
    gradients). CPU and fp32/fp64 inputs take the exact fp32 path. Tests force this path on CPU.
    """
    return hidden.is_cuda and hidden.dtype in _LOW_PRECISION and weight.dtype == hidden.dtype


def _mm_f32(a: Tensor, b: Tensor) -> Tensor:
    """a @ b with fp32 output: low-precision operands accumulate in fp32 where torch can."""
    if a.dtype in _LOW_PRECISION and a.is_cuda and _MM_OUT_DTYPE_OK[0]:
        try:
            return torch.mm(a, b, out_dtype=torch.float32)
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, TypeError, NotImplementedError):
            _MM_OUT_DTYPE_OK[0] = False  # older torch: fall back to fp32 operands below
    return torch.mm(a.float(), b.float())


class _ChunkedTokenStats(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden: Tensor,  # (N, H)
        weight: Tensor,  # (V, H)
        targets: Tensor,  # (N,)
        chunk_size: int,
        temperature: float,
        compute_entropy: bool,
        entropy_grad: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        cdt = _compute_dtype(hidden.dtype, weight.dtype)
        lowp = _low_precision_path(hidden, weight)
        # (V, H); fp32 copy only for low-precision weights off the fast path
        w = weight if lowp else weight.to(cdt)
        n_tok, vocab = hidden.shape[0], w.shape[0]
        logp = hidden.new_empty(n_tok, dtype=cdt)
        lse = hidden.new_empty(n_tok, dtype=cdt)
        entropy = hidden.new_empty(n_tok if compute_entropy else 0, dtype=cdt)
        rows = min(chunk_size, n_tok)
        # two (chunk, V) buffers reused across chunks: fresh multi-GB allocations page-fault on CPU.
        # log_softmax into the second one is also faster than torch.logsumexp on CPU.
        z_buf = hidden.new_empty((0 if lowp else rows, vocab), dtype=cdt)
        lp_buf = hidden.new_empty((rows, vocab), dtype=cdt)
        for start in range(0, n_tok, chunk_size):
            stop = min(start + chunk_size, n_tok)
            z, lp = z_buf[: stop - start], lp_buf[: stop - start]  # (n, V) each (z empty if lowp)
            if lowp:
                z = _mm_f32(hidden[start:stop], w.t())  # fresh (n, V) fp32; the CUDA allocator reuses it
            else:
                torch.mm(hidden[start:stop].to(cdt), w.t(), out=z)
            if temperature != 1.0:
                z.div_(temperature)
            torch.log_softmax(z, dim=1, out=lp)  # log p
            # log p = z − max − log Σ: at the argmax it is exactly −log Σ, so
            # lse = max z − max log p with no cancellation
            lse[start:stop] = z.amax(dim=1) - lp.amax(dim=1)
            logp[start:stop] = lp.gather(1, targets[start:stop, None]).squeeze(1)
            if compute_entropy:
                p = torch.exp(lp, out=z)  # logits are no longer needed
                entropy[start:stop] = -p.mul_(lp).sum(dim=1)

        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.chunk_size, ctx.temperature, ctx.entropy_grad = chunk_size, temperature, entropy_grad
        energy = -lse
        # one call: each mark_non_differentiable replaces the previous set
        ctx.mark_non_differentiable(*((energy,) if entropy_grad else (energy, entropy)))
        return logp, entropy, energy

    @staticmethod
    @once_differentiable
    def backward(ctx, g_logp: Tensor, g_entropy: Tensor, _g_energy: Tensor):
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[:2]
        if not (need_h or need_w):
            return (None,) * 7
        cdt = lse.dtype
        if _low_precision_path(hidden, weight):
            return _backward_low_precision(ctx, hidden, weight, targets, lse, entropy, g_logp, g_entropy)
        w = weight.to(cdt)  # (V, H)
        n_tok, vocab = hidden.shape[0], w.shape[0]
        chunk, tau = ctx.chunk_size, ctx.temperature
        # d z / d(h·Wᵀ) = 1/τ is folded into the per-token upstream gradients
        g_lp = g_logp.to(cdt) / tau  # (N,)
        g_ent = g_entropy.to(cdt) / tau if ctx.entropy_grad else None  # (N,)
        grad_hidden = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros_like(w) if need_w else None  # accumulated in fp32, cast at the end
        z_buf = hidden.new_empty((min(chunk, n_tok), vocab), dtype=cdt)
        p_buf = torch.empty_like(z_buf) if g_ent is not None else None
        for start in range(0, n_tok, chunk):
            stop = min(start + chunk, n_tok)
            h = hidden[start:stop].to(cdt)  # (n, H)
            tgt = targets[start:stop]
            g = g_lp[start:stop, None]  # (n, 1)
            z = z_buf[: stop - start]
            torch.mm(h, w.t(), out=z)
            if tau != 1.0:
                z.div_(tau)
            z.sub_(lse[start:stop, None])  # log p
            if p_buf is None:
                # grad_z = g·(onehot − p): the row scale g and the one-hot part are applied to the
                # (n, H) factors instead of the (n, V) matrix, which stays plain p
                p = z.exp_()
                if need_h:
                    grad_hidden[start:stop] = g * (w[tgt] - p @ w)
                if need_w:
                    gh = g * h  # (n, H)
                    grad_w.addmm_(p.t(), gh, alpha=-1.0)
                    grad_w.index_add_(0, tgt, gh)
            else:
                p = torch.exp(z, out=p_buf[: stop - start])
                # grad_z = g·onehot − p ∘ (g + g_ent·(log p + H)); m holds the second term
                m = z.add_(entropy[start:stop, None]).mul_(g_ent[start:stop, None]).add_(g).mul_(p)
                if need_h:
                    grad_hidden[start:stop] = g * w[tgt] - m @ w
                if need_w:
                    grad_w.addmm_(m.t(), h, alpha=-1.0)
                    grad_w.index_add_(0, tgt, g * h)
        grad_weight = grad_w.to(weight.dtype) if need_w else None
        return grad_hidden, grad_weight, None, None, None, None, None


def _backward_low_precision(ctx, hidden, weight, targets, lse, entropy, g_logp, g_entropy):
    """Backward for bf16/fp16 inputs: grad_z in fp32, then two low-precision tensor-core matmuls.

    The one-hot term is folded into grad_z before rounding (not applied to the (n, H) factors as in
    the exact path): g·(1 − p_y) of a confident token would otherwise cancel after p's rounding.
    """
    need_h, need_w = ctx.needs_input_grad[:2]
    cdt, ldt = lse.dtype, hidden.dtype
    n_tok = hidden.shape[0]
    chunk, tau = ctx.chunk_size, ctx.temperature
    g_lp = g_logp.to(cdt) / tau  # (N,)
    g_ent = g_entropy.to(cdt) / tau if ctx.entropy_grad else None  # (N,)
    grad_hidden = torch.empty_like(hidden) if need_h else None
    grad_w = torch.zeros(weight.shape, dtype=cdt, device=weight.device) if need_w else None
    for start in range(0, n_tok, chunk):
        stop = min(start + chunk, n_tok)
        h = hidden[start:stop]  # (n, H)
        g = g_lp[start:stop, None]  # (n, 1)
        z = _mm_f32(h, weight.t())  # (n, V) fp32
        if tau != 1.0:
            z.div_(tau)
        z.sub_(lse[start:stop, None])  # log p
        if g_ent is None:
            gz = z.exp_().mul_(-g)  # −g·p
        else:
            p = torch.exp(z)
            # −p ∘ (g + g_ent·(log p + H))
            gz = z.add_(entropy[start:stop, None]).mul_(g_ent[start:stop, None]).add_(g).mul_(p).neg_()
            del p
        rows = torch.arange(stop - start, device=gz.device)
        gz[rows, targets[start:stop]] += g.squeeze(1)  # + g·onehot, before rounding
        gz = gz.to(ldt)
        if need_h:
            grad_hidden[start:stop] = _mm_f32(gz, weight)
        if need_w:
            grad_w.add_(_mm_f32(gz.t(), h))
    grad_weight = grad_w.to(weight.dtype) if need_w else None
    return grad_hidden, grad_weight, None, None, None, None, None


def token_statistics(
    hidden: Tensor,
    lm_head_weight: Tensor,
    targets: Tensor,
    *,
    chunk_size: int,
    temperature: float = 1.0,
    compute_entropy: bool = True,
    entropy_grad: bool = False,
) -> TokenStats:
    """Log-prob of each target token, entropy and energy of the LM head's distribution, chunked.

    Logits = hidden @ lm_head_weightᵀ / temperature are computed in fp32 (fp64 if an input is fp64)
    for `chunk_size` tokens at a time, in forward and again in backward, so memory holds at most
    two (chunk_size, V) buffers instead of (B·T, V). bf16/fp16 inputs work; gradients come back
    in the inputs' dtypes. On CUDA, bf16/fp16 inputs feed tensor-core matmuls that accumulate and
    output fp32 (exact products, so the same logits up to summation order); in backward the fp32
    logit gradient is rounded once to the input dtype for its two matmuls.

    Energy is −logsumexp(logits / temperature): the same tempered logits as logp and entropy, so
    one reference pass gives the KL's ref logp and ActFocus's energy together; with temperature 1
    (the usual reference setting) it is exactly ActFocus's E_t = −log Σ_v exp(f_v).

    Gradients reach `hidden` and `lm_head_weight` through logp, and through entropy only when
    entropy_grad is True (otherwise entropy is a constant, like energy, which never has one).

    Args:
        hidden: (..., H) final hidden states, e.g. (B, T, H), aligned with targets.
        lm_head_weight: (V, H) output embedding.
        targets: (...) integer token ids in [0, V), the shape of hidden without its last dim.
        chunk_size: tokens per chunk; scripts/bench_algo.py measured 1024 fastest on CPU; on an H200
            (bf16, V=152k) 2048 to 8192 are within 4% of each other, 4096 a good memory/speed balance.
        temperature: > 0, the sampling temperature the rollouts used.
        compute_entropy: False skips the entropy (returned as None).
        entropy_grad: let gradients flow through entropy (needs compute_entropy).

    Returns:
        TokenStats(logp, entropy, energy), each shaped like targets.
    """
    check_tensor(hidden, "hidden", kind="float")
    if hidden.ndim < 2:
        raise ValueError(f"hidden must have shape (..., H), got {tuple(hidden.shape)}")
    check_tensor(lm_head_weight, "lm_head_weight", ndim=2, kind="float")
    if lm_head_weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"lm_head_weight must have shape (V, H={hidden.shape[-1]}), got {tuple(lm_head_weight.shape)}"
        )
    check_tensor(targets, "targets", kind="int")
    if targets.shape != hidden.shape[:-1]:
        raise ValueError(f"targets must have shape {tuple(hidden.shape[:-1])}, got {tuple(targets.shape)}")
    if lm_head_weight.device != hidden.device or targets.device != hidden.device:
        raise ValueError(
            f"hidden, lm_head_weight and targets must be on one device, got "
            f"{hidden.device}, {lm_head_weight.device}, {targets.device}"
        )
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    temperature = check_number(temperature, "temperature", min_value=0.0, min_inclusive=False)
    if entropy_grad and not compute_entropy:
        raise ValueError("entropy_grad=True needs compute_entropy=True")
    vocab = lm_head_weight.shape[0]
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
        raise ValueError(
            f"targets must lie in [0, V={vocab}), got range [{int(targets.min())}, {int(targets.max())}]"
        )

    shape = targets.shape
    logp, entropy, energy = _ChunkedTokenStats.apply(
        hidden.reshape(-1, hidden.shape[-1]),
        lm_head_weight,
        targets.reshape(-1),
        chunk_size,
        temperature,
        compute_entropy,
        entropy_grad,
    )
    return TokenStats(logp.view(shape), entropy.view(shape) if compute_entropy else None, energy.view(shape))
