"""Compressor families: dpcomp against GRACE-style eager PyTorch versions of the same
algorithms, on the same gradient shapes, in one run.

Rounds alternate `dpcomp bench compress --json` (our compress + decompress per step: encode to
the in-memory message and decode back to dense tensors of the parameters' shapes, no bytes) with
the same work in eager PyTorch on tensors of the shapes that command reports (`layer_shapes`),
as benches/compress_vs_pytorch.py does for the paper's compressors (its `dpcomp` runner is
reused). The peers follow GRACE (Xu et al., ICDCS 2021, sands-lab/grace,
grace_dl/torch/compressor/*.py, re-written here), one worker, compress then decompress per tensor:

- QSGD (`qsgd.py`, `QSGDCompressor(quantum_num)`): level = floor(s |x| / norm) + Bernoulli(frac),
  codes (level x sign) as int8, decode codes x norm / s; with ours' buckets of 512 (GRACE takes
  one norm per tensor): the flat tensor zero-padded to rows of 512, one norm per row.
- TernGrad (`terngrad.py`, without its 2.5 std clipping, as ours): scalar = max |x|,
  u ~ U[0, scalar) (`.item()`), sign x scalar zeroed where u >= |x|, sent as int8 signs.
- signSGD (`signsgd.py`): x >= 0 as uint8; decode 2 b - 1 as float.
- EF-signSGD (`efsignsgd.py` + GRACE's `ResidualMemory`): p = g + e; mean |p| and x >= 0 as
  uint8; decode mean x (2 b - 1); e = p - decoded (GRACE's memory decodes a second time; here the
  decoded tensor is reused, in the peer's favour).
- Random-k (`randomk.py` + `ResidualMemory`): `torch.manual_seed(h)` per tensor and step, k =
  floor(numel / rate) indices `torch.randperm(numel)[:k]`, values v[idx] of v = g + residual;
  decode zeros `.scatter_(0, idx, values)`; residual = v - decoded.
- Threshold-v (`threshold.py` + `ResidualMemory`): v = g + residual;
  `torch.where(v.abs() >= thr)` indices and their values; decode zeros `.scatter_`;
  residual = v - decoded.
- fp16: PyTorch's `fp16_compress_hook` cast, `tensor.to(torch.float16)` and back to float32
  (GRACE's `FP16Compressor` is the same two casts).
- bf16: `bf16_compress_hook`'s cast, `tensor.to(torch.bfloat16)` and back.
- int8: scale = max |x| / 127, codes round(x / scale) clamped to +-127 as int8, decode
  codes x scale (the common 8-bit baseline; no GRACE class).
- Natural compression (`natural.py`'s algorithm, re-written: GRACE's takes `2 ** log_floor` on
  int8 exponents, which is 0 for every |x| < 1 and then sends 2^-1 or 2^0 for them): `torch.frexp`
  gives |x| = m 2^e, m in [0.5, 1), so low = 2^(e-1) = |x| / (2m), and 2 low is sent with
  probability (|x| - low) / low (`torch.bernoulli`), times the sign.

The peers see Gaussian tensors of the DP noise's scale σ C / B (ours sees the model's gradients
plus that noise, which dominates), fresh every step and drawn before the timer starts; the
threshold therefore passes about the same share on both sides (printed). `check_peers` tests
every peer before timing: unbiasedness over many draws where the algorithm claims it, the value
sets (levels, ternary, signs, powers of two by their bit patterns), the error-feedback identity
decoded + new residual = g + old residual.

Both sides run with dpcomp's allocator policy (the script re-executes itself with
MALLOC_MMAP_MAX_=0 and MALLOC_TRIM_THRESHOLD_ set, as compress_vs_pytorch.py does; see there).
The printed ratio is peer time / dpcomp time (median of rounds); >= 1 means ours is at least as
fast. `--jsonl PATH` appends the rows (with every round's times) to PATH.

`--variants` times instead, on the same shapes, eager replicas of our op sequences (the ATen ops
crates/dpcomp/src/compress/*.rs and message.rs's `to_dense` issue through tch, in order) beside rewrites of
them and the peers, to find which ops cost where ours is slower (`check_variants` first tests the
rewrites against ours: equal where deterministic, unbiased where stochastic).

    OMP_NUM_THREADS=1 .venv/bin/python benches/families_vs_pytorch.py --task cifar100 \
        --batch-size 64 --steps 4 --rounds 3 [--dpcomp BINARY] [--variants]
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compress_vs_pytorch import dpcomp, print_results  # noqa: E402

# The paper's clipping radius per task (crates/dpcomp-lab/src/tasks.rs `paper_defaults`): the noise scale σ C / B.
CLIP = {"surnames": 3.0, "cifar10": 5.0, "cifar100": 1000.0, "snli": 21.0}


class Peer:
    """One worker's compress + decompress of every tensor, with per-tensor state if any."""

    def __init__(self, shapes):
        self.shapes = shapes

    def step(self, grads):
        return [self.one(i, g) for i, g in enumerate(grads)]


class GraceQsgd(Peer):
    def __init__(self, shapes, levels, bucket=512):
        super().__init__(shapes)
        self.s, self.bucket = levels, bucket

    def one(self, i, g):
        tensor = g.flatten()
        numel = tensor.numel()
        bucket = numel if self.bucket <= 0 or self.bucket >= numel else self.bucket
        rows = -(-numel // bucket)
        padded = torch.nn.functional.pad(tensor, (0, rows * bucket - numel)).view(rows, bucket)
        norm = padded.norm(dim=1, keepdim=True)
        level_float = self.s / norm * padded.abs()
        previous_level = level_float.floor()
        prob = torch.empty_like(padded).uniform_()
        is_next_level = (prob < (level_float - previous_level)).type(torch.float32)
        new_level = previous_level + is_next_level
        codes = (new_level * padded.sign()).type(torch.int8 if self.s < 128 else torch.int16)
        # receiver
        decoded = norm / self.s * codes.type(torch.float32)
        return decoded.view(-1)[:numel].view(g.shape)


class GraceTernGrad(Peer):
    def one(self, i, g):
        tensor = g.flatten()
        abs_gradient = tensor.abs()
        scalar = abs_gradient.max()
        sign_gradient = tensor.sign() * scalar
        rnd_sample = torch.empty_like(tensor).uniform_(0, scalar.item())
        sign_gradient[rnd_sample >= abs_gradient] = 0
        codes = sign_gradient.sign().type(torch.int8)
        # receiver
        return (codes.type(torch.float32) * scalar).view(g.shape)


class GraceSignSgd(Peer):
    def one(self, i, g):
        bits = (g.flatten() >= 0).type(torch.uint8)
        return (bits.type(torch.float32) * 2 - 1).view(g.shape)


class GraceEfSignSgd(Peer):
    def __init__(self, shapes):
        super().__init__(shapes)
        self.residuals = [torch.zeros(s) for s in shapes]

    def one(self, i, g):
        p = (self.residuals[i] + g).flatten()
        bits = (p >= 0).type(torch.uint8)
        mean = p.abs().mean()
        decoded = mean * (bits.type(torch.float32) * 2 - 1)
        self.residuals[i] = (p - decoded).view(g.shape)
        return decoded.view(g.shape)


class GraceRandomK(Peer):
    def __init__(self, shapes, rate):
        super().__init__(shapes)
        self.rate = rate
        self.residuals = [torch.zeros(s) for s in shapes]
        self.global_step = 0

    def step(self, grads):
        out = super().step(grads)
        self.global_step += 1
        return out

    def one(self, i, g):
        v = (self.residuals[i] + g).flatten()
        numel = v.numel()
        k = min(numel, max(1, math.floor(numel / self.rate)))
        torch.manual_seed(1000003 * self.global_step + i)
        indices = torch.randperm(numel)[:k]
        values = v[indices]
        # receiver (same seed, same indices)
        decoded = torch.zeros(numel, dtype=values.dtype).scatter_(0, indices, values)
        self.residuals[i] = (v - decoded).view(g.shape)
        return decoded.view(g.shape)


class GraceThreshold(Peer):
    def __init__(self, shapes, threshold):
        super().__init__(shapes)
        self.threshold = threshold
        self.residuals = [torch.zeros(s) for s in shapes]
        self.sent = 0

    def one(self, i, g):
        v = (self.residuals[i] + g).flatten()
        (indices,) = torch.where(v.abs() >= self.threshold)
        values = v[indices]
        self.sent += indices.numel()
        decoded = torch.zeros(v.numel(), dtype=values.dtype).scatter_(0, indices, values)
        self.residuals[i] = (v - decoded).view(g.shape)
        return decoded.view(g.shape)


class TorchCast(Peer):
    def __init__(self, shapes, dtype):
        super().__init__(shapes)
        self.dtype = dtype

    def one(self, i, g):
        return g.to(self.dtype).to(torch.float32)


class TorchInt8(Peer):
    def one(self, i, g):
        scale = g.abs().max() / 127
        codes = (g / scale).round_().clamp_(-127, 127).to(torch.int8)
        return codes.to(torch.float32) * scale


class Natural(Peer):
    def one(self, i, g):
        magnitude = g.abs()
        mantissa, _ = torch.frexp(magnitude)
        low = magnitude / (2 * mantissa)  # 2^(e - 1), exact; NaN for 0
        up = torch.bernoulli(((magnitude - low) / low).nan_to_num_(0.0))
        return (low * (1 + up)).nan_to_num_(0.0) * g.sign()


def check_peers():
    """Every peer's algorithm on small tensors, before any timing."""
    torch.manual_seed(0)
    x = torch.randn(3, 700) * 2.0
    x[0, :5] = torch.tensor([0.0, 1.0, -0.25, 3.0, 2.0 ** -130])
    shapes = [tuple(x.shape)]
    draws = 4000

    def mean_of(peer, n=draws):
        return torch.stack([peer.step([x])[0] for _ in range(n)]).mean(0)

    def unbiased(name, peer, spread):
        err = (mean_of(peer) - x).abs().max().item()
        assert err < 3 * spread / math.sqrt(draws), f"{name}: biased, max |E - x| = {err}"

    # QSGD: levels within 0..s (codes x norm / s), unbiased.
    for s in (16, 4):
        q = GraceQsgd(shapes, s)
        out = q.step([x])[0].flatten()
        norms = torch.nn.functional.pad(x.flatten(), (0, 512 - 2100 % 512)).view(-1, 512).norm(dim=1)
        codes = (out.view(-1) / torch.repeat_interleave(norms, 512)[:2100] * s)
        assert torch.allclose(codes, codes.round(), atol=1e-3) and codes.abs().max() <= s
        unbiased(f"qsgd s={s}", q, norms.max().item() / s)
    # TernGrad: values in {0, +-max}, unbiased.
    t = GraceTernGrad(shapes)
    out = t.step([x])[0]
    m = x.abs().max()
    assert bool(((out == 0) | (out.abs() == m)).all()), "terngrad: not ternary"
    unbiased("terngrad", t, m.item())
    # signSGD: +-1, +1 at 0.
    out = GraceSignSgd(shapes).step([x])[0]
    assert torch.equal(out, torch.where(x >= 0, 1.0, -1.0)), "signsgd: wrong signs"
    # EF-signSGD: decoded = mean |p| sign(p); decoded + new error = g + old error.
    e = GraceEfSignSgd(shapes)
    for _ in range(3):
        old = e.residuals[0].clone()
        out = e.step([x])[0]
        p = old + x
        assert torch.allclose(out, p.abs().mean() * torch.where(p >= 0, 1.0, -1.0))
        assert torch.allclose(out + e.residuals[0], p, atol=1e-6), "ef-signsgd: error identity"
    # Random-k: k distinct coordinates sent, the rest kept.
    r, y = GraceRandomK(shapes, 32.0), x.abs() + 1  # no zeros: every sent value is nonzero
    for _ in range(3):
        old = r.residuals[0].clone()
        out = r.step([y])[0]
        assert int((out != 0).sum()) == 2100 // 32, "randomk: not k coordinates"
        assert torch.allclose(out + r.residuals[0], old + y, atol=1e-6), "randomk: identity"
    # Threshold: sent >= v, kept < v, identity.
    th = GraceThreshold(shapes, 2.5)
    for _ in range(3):
        old = th.residuals[0].clone()
        out = th.step([x])[0]
        sent = out != 0
        assert bool((out[sent].abs() >= 2.5).all()) and bool((th.residuals[0].abs() < 2.5).all())
        assert torch.allclose(out + th.residuals[0], old + x, atol=1e-6), "threshold: identity"
    # Casts: round trips of torch's own casts; bf16 rounds the tie 1 + 2^-8 to even.
    out = TorchCast(shapes, torch.bfloat16).step([torch.tensor([1.0, 1.00390625, -3.3])])[0]
    assert out.tolist() == [1.0, 1.0, -3.296875], "bf16"
    # int8: codes within +-127, error at most half a step.
    out = TorchInt8(shapes).step([x])[0]
    step = x.abs().max() / 127
    assert (out - x).abs().max() <= step / 2 + 1e-6 and torch.allclose(out.abs().max(), x.abs().max())
    # Natural: every value a signed power of two (no mantissa bits) bracketing x, unbiased.
    n = Natural(shapes)
    out = n.step([x])[0]
    normal = out.abs() >= 2.0 ** -126  # subnormal powers of two have one mantissa bit
    bits = out.abs()[normal].view(torch.int32)
    assert bool(((bits & 0x007FFFFF) == 0).all()), "natural: not powers of two"
    assert out[0, 4].item() in (2.0 ** -130, 2.0 ** -129), "natural: subnormal"
    nz = x != 0
    ratio = out[nz] / x[nz]
    assert bool(((ratio > 0.5) & (ratio <= 2)).all()), "natural: not a neighbour"
    assert out[0, 0] == 0 and out[0, 1] == 1.0 and out[0, 2] == -0.25
    assert bool((out.sign() == x.sign()).all())
    unbiased("natural", n, x.abs().max().item())


def time_peer(make, shapes, steps, scale):
    peer = make(shapes)
    gen = torch.Generator().manual_seed(1)
    peer.step([torch.randn(s, generator=gen) * scale for s in shapes])
    total = 0.0
    for _ in range(steps):
        update = [torch.randn(s, generator=gen) * scale for s in shapes]
        start = time.perf_counter()
        peer.step(update)
        total += time.perf_counter() - start
    return total / steps, peer


# --variants: eager replicas of ours (the op sequence of crates/dpcomp/src/compress/*.rs, as tch issues it to
# the same ATen kernels) beside rewrites of it and the GRACE peer, to see which ops cost.
MIN_NORMAL = 2.0 ** -126


def _signs_i32(flat):
    return ((flat >= 0).to(torch.int32) * 2 - 1).to(torch.int32)


def sign_ours(g):  # sign.rs SignEncoder + Unpack
    return _signs_i32(g.reshape(-1)).to(torch.float32).view(g.shape)


def sign_where_i8(g, one=torch.tensor(1, dtype=torch.int8), neg=torch.tensor(-1, dtype=torch.int8)):
    codes = torch.where(g.reshape(-1) >= 0, one, neg)  # int8 codes in one pass
    return codes.to(torch.float32).view(g.shape)


def sign_i32_inplace(g):
    codes = (g.reshape(-1) >= 0).to(torch.int32).mul_(2).sub_(1)
    return codes.to(torch.float32).view(g.shape)


def sign_i8_inplace(g):
    codes = (g.reshape(-1) >= 0).to(torch.int8).mul_(2).sub_(1)
    return codes.to(torch.float32).view(g.shape)


class EfOurs:  # sign.rs EfSignEncoder + Unpack
    def __init__(self, shapes):
        self.e = [torch.zeros(s) for s in shapes]

    def step(self, grads):
        out = []
        for e, g in zip(self.e, grads):
            flat = e.add_(g).reshape(-1)
            scale = flat.abs().mean().reshape(1)
            codes = _signs_i32(flat)
            sent = codes.to(torch.float32) * scale
            flat.sub_(sent)
            out.append((codes.to(torch.float32) * scale.reshape(-1)[0]).view(g.shape))
        return out


class EfLean(EfOurs):
    """int8 codes (compare, cast, in-place x2 - 1), the sent tensor scaled in place and
    subtracted in place, the decoded one scaled in place. (The scale stays abs().mean():
    `vector_norm(ord=1)` avoids the |p| tensor but its CPU kernel is 3x slower.)"""

    def step(self, grads):
        out = []
        for e, g in zip(self.e, grads):
            flat = e.add_(g).reshape(-1)
            scale = flat.abs().mean()
            codes = (flat >= 0).to(torch.int8).mul_(2).sub_(1)
            flat.sub_(codes.to(torch.float32).mul_(scale))
            out.append(codes.to(torch.float32).mul_(scale).view(g.shape))
        return out


def tern_ours(g):  # terngrad.rs + Unpack
    flat = g.reshape(-1)
    m = flat.abs().max().reshape(1)
    safe = torch.where(m > 0, m, 1.0)
    keep = (flat.abs() / safe + torch.rand_like(flat)).floor().clamp_max(1.0)
    codes = (keep * flat.sign()).to(torch.int32)
    return (codes.to(torch.float32) * m.reshape(-1)[0]).view(g.shape)


def tern_lean(g):
    """keep = u max < |g| (one compare instead of divide + add + floor + clamp), |g| once,
    int8 codes: sign as int8 zeroed where not kept."""
    flat = g.reshape(-1)
    a = flat.abs()
    m = a.max()
    keep = torch.rand_like(flat).mul_(m) < a
    codes = flat.sign().to(torch.int8).mul_(keep)
    return codes.to(torch.float32).mul_(m).view(g.shape)


def int8_ours(g):  # cast.rs Int8Encoder + Unpack
    flat = g.reshape(-1)
    scale = flat.abs().max().reshape(1) / 127.0
    safe = torch.where(scale > 0, scale, 1.0)
    x = flat / safe
    codes = x.round().clamp(-127.0, 127.0).to(torch.int32)
    return (codes.to(torch.float32) * scale.reshape(-1)[0]).view(g.shape)


def int8_inplace_i32(g):
    flat = g.reshape(-1)
    scale = flat.abs().max() / 127.0
    safe = torch.where(scale > 0, scale, 1.0)
    codes = (flat / safe).round_().clamp_(-127.0, 127.0).to(torch.int32)
    return codes.to(torch.float32).mul_(scale).view(g.shape)


def int8_lean(g):
    flat = g.reshape(-1)
    scale = flat.abs().max() / 127.0
    safe = torch.where(scale > 0, scale, 1.0)
    codes = (flat / safe).round_().clamp_(-127.0, 127.0).to(torch.int8)
    return codes.to(torch.float32).mul_(scale).view(g.shape)


def natural_ours(t):  # natural.rs natural_round + Unpack
    x = t.to(torch.float32)
    magnitude = x.abs()
    low = magnitude.view(torch.int32).bitwise_and(0x7F800000).view(torch.float32)
    high = torch.where(low > 0, low * 2.0, torch.full_like(low, MIN_NORMAL))
    up = ((magnitude - low) / (high - low)).nan_to_num(0.0).clamp(0.0, 1.0)
    chosen = torch.where(torch.rand_like(magnitude) < up, high, low)
    chosen = torch.where(chosen.isfinite(), chosen, low)
    return (chosen * x.sign()).to(torch.float32)


def natural_lean(t):
    """high from the exponent bits + 1 (2^-126 for subnormals and 0, inf above 2^127, where
    u (high - low) < |t| - low is then false): no where / nan_to_num / clamp / isfinite; the
    sign by copysign."""
    magnitude = t.abs()
    bits = magnitude.view(torch.int32).bitwise_and(0x7F800000)
    low = bits.view(torch.float32)
    high = (bits + 0x00800000).view(torch.float32)
    pick = torch.rand_like(magnitude).mul_(high - low) < magnitude.sub_(low)
    return torch.where(pick, high, low).copysign_(t)


def qsgd_ours(g, s=16, bucket=512):  # qsgd.rs + Unpack (scale_buckets)
    flat = g.reshape(-1)
    numel = flat.numel()
    b = numel if bucket >= numel else bucket
    rows_n = -(-numel // b)
    rows = torch.nn.functional.pad(flat, (0, rows_n * b - numel)).view(rows_n, b)
    norms = rows.norm(2, dim=1)
    safe = torch.where(norms > 0, norms, 1.0)
    scaled = rows.abs() * float(s) / safe.unsqueeze(1)
    levels = (scaled + torch.rand_like(scaled)).floor().clamp_max(float(s))
    codes = (levels * rows.sign()).view(-1)[:numel].to(torch.int32)
    values = codes.to(torch.float32) / float(s)
    padded = torch.nn.functional.pad(values, (0, rows_n * b - numel))
    return (padded.view(rows_n, b) * norms.view(-1, 1)).view(-1)[:numel].view(g.shape)


def qsgd_lean(g, s=16, bucket=512):
    flat = g.reshape(-1)
    numel = flat.numel()
    b = numel if bucket >= numel else bucket
    rows_n = -(-numel // b)
    rows = torch.nn.functional.pad(flat, (0, rows_n * b - numel)).view(rows_n, b)
    norms = torch.linalg.vector_norm(rows, 2, dim=1, keepdim=True)
    safe = torch.where(norms > 0, norms, 1.0)
    levels = rows.abs().mul_(float(s) / safe).add_(torch.rand_like(rows)).floor_().clamp_max_(s)
    codes = levels.mul_(rows.sign()).to(torch.int8)
    return codes.to(torch.float32).mul_(norms / float(s)).view(-1)[:numel].view(g.shape)


class Fn(Peer):
    def __init__(self, shapes, fn):
        super().__init__(shapes)
        self.fn = fn

    def one(self, i, g):
        return self.fn(g)


def check_variants():
    torch.manual_seed(0)
    x = torch.randn(3, 700) * 2.0
    x[0, :3] = torch.tensor([0.0, 1.0, -0.25])
    for a, b in ((sign_ours, sign_where_i8), (sign_ours, sign_i8_inplace),
                 (sign_ours, sign_i32_inplace), (int8_ours, int8_inplace_i32)):
        assert torch.equal(a(x), b(x))
    assert torch.equal(int8_ours(x), int8_lean(x))
    e1, e2 = EfOurs([x.shape]), EfLean([x.shape])
    for _ in range(3):
        assert torch.allclose(e1.step([x])[0], e2.step([x])[0], atol=1e-5)
    n = 4000
    for fn in (tern_lean, natural_lean, qsgd_lean):
        m = torch.stack([fn(x) for _ in range(n)]).mean(0)
        assert (m - x).abs().max() < 3 * x.abs().max() / math.sqrt(n), fn.__name__
    out = natural_lean(torch.tensor([0.0, 2.0 ** -130, 3.0, -1.0]))
    assert out[0] == 0 and out[1] in (0.0, MIN_NORMAL) and out[2] in (2.0, 4.0) and out[3] == -1


def run_variants(shapes, steps, rounds, scale):
    check_variants()
    groups = {
        "signsgd": [("ours (eager replica)", lambda s: Fn(s, sign_ours)),
                    ("int8 codes by where", lambda s: Fn(s, sign_where_i8)),
                    ("int32 codes, mul_/sub_", lambda s: Fn(s, sign_i32_inplace)),
                    ("int8 codes, mul_/sub_", lambda s: Fn(s, sign_i8_inplace)),
                    ("GRACE peer", GraceSignSgd)],
        "ef-signsgd": [("ours (eager replica)", EfOurs), ("lean", EfLean),
                       ("GRACE peer", GraceEfSignSgd)],
        "terngrad": [("ours (eager replica)", lambda s: Fn(s, tern_ours)),
                     ("lean", lambda s: Fn(s, tern_lean)), ("GRACE peer", GraceTernGrad)],
        "int8": [("ours (eager replica)", lambda s: Fn(s, int8_ours)),
                 ("in place, int32 codes", lambda s: Fn(s, int8_inplace_i32)),
                 ("lean (in place, int8 codes)", lambda s: Fn(s, int8_lean)),
                 ("eager int8 peer", TorchInt8)],
        "natural": [("ours (eager replica)", lambda s: Fn(s, natural_ours)),
                    ("lean", lambda s: Fn(s, natural_lean)), ("frexp peer", Natural)],
        "qsgd16": [("ours (eager replica)", lambda s: Fn(s, qsgd_ours)),
                   ("lean", lambda s: Fn(s, qsgd_lean)), ("GRACE peer", lambda s: GraceQsgd(s, 16))],
    }
    rows = []
    for group, variants in groups.items():
        times = {name: [] for name, _ in variants}
        for _ in range(rounds):
            for name, make in variants:
                times[name].append(time_peer(make, shapes, steps, scale)[0])
        base = statistics.median(times[variants[0][0]])
        for name, _ in variants:
            t = statistics.median(times[name])
            rows.append({"variants": group, "variant": name, "seconds": t, "vs_ours_replica": t / base})
            print(f"{group:10s} {name:24s} {t * 1e3:7.1f} ms  {t / base:.2f} x ours-replica", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="cifar100")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=32.0, help="random-k rate")
    ap.add_argument("--threshold", type=float, default=None,
                    help="threshold-v's v (default: 4 x the noise scale σ C / B)")
    ap.add_argument("--noise-multiplier", type=float, default=0.8)
    ap.add_argument("--compressors", default="",
                    help="comma-separated subset of the case names (qsgd16, qsgd4, terngrad, "
                         "signsgd, ef-signsgd, randomk, threshold, fp16, bf16, int8, natural)")
    ap.add_argument("--dpcomp", default="target/release/dpcomp")
    ap.add_argument("--jsonl", default="", help="append the result rows here")
    ap.add_argument("--variants", action="store_true",
                    help="time eager replicas of ours' op sequences against rewrites instead")
    ap.add_argument("--system-malloc", action="store_true",
                    help="keep glibc's default allocator settings for the PyTorch peers")
    args = ap.parse_args()
    if not args.system_malloc and os.environ.get("MALLOC_MMAP_MAX_") != "0":
        env = dict(os.environ, MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_="2147483647")
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    scale = args.noise_multiplier * CLIP[args.task] / args.batch_size
    thr = args.threshold if args.threshold is not None else 4 * scale
    cases = [
        ("qsgd16", "qsgd", ["--compressor-option", "levels=16"],
         lambda s: GraceQsgd(s, 16), "GRACE QSGD, buckets of 512"),
        ("qsgd4", "qsgd", ["--compressor-option", "levels=4"],
         lambda s: GraceQsgd(s, 4), "GRACE QSGD, buckets of 512"),
        ("terngrad", "terngrad", [], GraceTernGrad, "GRACE TernGrad, no clipping"),
        ("signsgd", "signsgd", [], GraceSignSgd, "GRACE signSGD"),
        ("ef-signsgd", "ef-signsgd", [], GraceEfSignSgd, "GRACE EF-signSGD + residual"),
        ("randomk", "randomk", ["--rate", str(args.rate)],
         lambda s: GraceRandomK(s, args.rate), "GRACE random-k + residual"),
        ("threshold", "threshold", ["--compressor-option", f"threshold={thr}"],
         lambda s: GraceThreshold(s, thr), "GRACE threshold-v + residual"),
        ("fp16", "fp16", [], lambda s: TorchCast(s, torch.float16), "fp16_compress_hook cast"),
        ("bf16", "bf16", [], lambda s: TorchCast(s, torch.bfloat16), "bf16_compress_hook cast"),
        ("int8", "int8", [], TorchInt8, "eager int8, per-tensor scale"),
        ("natural", "natural", [], Natural, "natural compression (frexp)"),
    ]
    chosen = args.compressors.split(",") if args.compressors else [c[0] for c in cases]
    unknown = set(chosen) - {c[0] for c in cases}
    if unknown:
        raise SystemExit(f"--compressors: unknown {sorted(unknown)}")
    check_peers()
    print("peers checked", flush=True)
    if args.variants:
        report = dpcomp(args.dpcomp, args.task, args.batch_size, 1, "fp16", [])
        rows = run_variants([tuple(s) for s in report["layer_shapes"]], args.steps, args.rounds,
                            scale)
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                for r in rows:
                    f.write(json.dumps({"task": args.task, **r}) + "\n")
        return
    results = []
    for case, name, extra, make, peer_name in (c for c in cases if c[0] in chosen):
        ours, theirs, backward, extra_info = [], [], [], {}
        for r in range(args.rounds):
            report = dpcomp(args.dpcomp, args.task, args.batch_size, args.steps, name,
                            [*extra, "--noise-multiplier", str(args.noise_multiplier)])
            shapes = [tuple(s) for s in report["layer_shapes"]]
            ours.append(report["mean_compress_decompress_seconds"])
            backward.append(report["mean_backward_seconds"])
            seconds, peer = time_peer(make, shapes, args.steps, scale)
            theirs.append(seconds)
            if case == "threshold":
                numel = sum(math.prod(s) for s in shapes)
                extra_info = {
                    "threshold": thr,
                    "dpcomp_sent_share": report["wire_bits_per_step"] / 64 / numel,
                    "peer_sent_share": peer.sent / (args.steps + 1) / numel,
                }
            print(f"{case} round {r + 1}: dpcomp {ours[-1] * 1e3:.2f} ms, {peer_name} "
                  f"{theirs[-1] * 1e3:.2f} ms, peer / dpcomp {theirs[-1] / ours[-1]:.2f} "
                  f"{extra_info or ''}", flush=True)
        o, t, b = statistics.median(ours), statistics.median(theirs), statistics.median(backward)
        results.append({
            "case": case, "compressor": report["compressor"], "peer": peer_name,
            "task": args.task, "batch_size": args.batch_size,
            "dpcomp_seconds": o, "pytorch_seconds": t, "speedup_pytorch_over_dpcomp": t / o,
            "dpcomp_rounds_seconds": ours, "pytorch_rounds_seconds": theirs,
            "dpcomp_ratio_to_backward": o / b, "dpcomp_backward_seconds": b,
            "wire_bits_per_step": report["wire_bits_per_step"],
            "achieved_rate": report["achieved_rate"],
            "dpcomp_threads": report["threads"], "threads": torch.get_num_threads(),
            "peer_malloc": "glibc defaults" if args.system_malloc else "heap, never trimmed",
            **extra_info,
        })
    if args.jsonl:
        with open(args.jsonl, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    print_results(results)


if __name__ == "__main__":
    main()
