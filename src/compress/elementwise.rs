//! Fused elementwise updates of flat f32 tensors in host memory: one pass where LibTorch's ops
//! take two (issue 37: Denoise's passes over the model are bound by memory bandwidth on a CPU).
//!
//! Each update applies plain f32 arithmetic, one rounding per operation in the order written,
//! as LibTorch's separate ops do (Rust neither contracts `a * b + c` into a fused multiply-add
//! nor reorders float operations), so the values equal those of the ops it replaces; the
//! callers test that. On any other device, or for other layouts, [`update`] declines and the
//! caller runs LibTorch's ops.

use tch::{Device, Kind, Tensor};

/// Whether `t` is a contiguous flat f32 tensor of `len` values in host memory.
fn host_f32(t: &Tensor, len: usize) -> bool {
    t.device() == Device::Cpu
        && t.kind() == Kind::Float
        && t.is_contiguous()
        && t.dim() == 1
        && t.numel() == len
}

/// `out[i] = f(out[i], a[i], b[i])` for every i, in one pass, when `out`, `a` and `b` are
/// contiguous flat f32 tensors of one length in host memory and `out` shares memory with
/// neither; returns whether it ran (`false`: nothing was changed).
pub(crate) fn update(
    out: &mut Tensor,
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(f32, f32, f32) -> f32,
) -> bool {
    match host_slices(out, a, b) {
        Some((out, a, b)) => {
            for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                *o = f(*o, x, y);
            }
            true
        }
        None => false,
    }
}

/// The elements of a vector whose magnitude reached a threshold: their positions (ascending)
/// and magnitudes, the candidates of a sampled top-k (`compress::topk`).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Candidates {
    pub positions: Vec<i64>,
    pub magnitudes: Vec<f32>,
}

impl Candidates {
    fn push(&mut self, position: usize, magnitude: f32) {
        self.positions.push(position as i64);
        self.magnitudes.push(magnitude);
    }
}

/// [`update`] that, in the same pass, also collects the candidates of two sampled top-k
/// selections: the elements of `a` with |a| >= `a_at_least` and those of the new `out` with
/// |out| >= `out_at_least` (an ordered comparison: NaN never passes). Denoise's sender forms
/// its acceleration this way and selects from both candidates without reading either vector
/// again (issue 37). `None` (nothing changed) where [`update`] declines.
pub(crate) fn update_collecting(
    out: &mut Tensor,
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(f32, f32, f32) -> f32,
    a_at_least: f32,
    out_at_least: f32,
) -> Option<(Candidates, Candidates)> {
    let (out, a, b) = host_slices(out, a, b)?;
    let (mut of_a, mut of_out) = (Candidates::default(), Candidates::default());
    // Blocks of 16: the arithmetic and the comparisons of a block run without branches (and
    // vectorise); only blocks with a candidate branch, once per candidate.
    const BLOCK: usize = 16;
    let whole = out.len() / BLOCK * BLOCK;
    for start in (0..whole).step_by(BLOCK) {
        let o = &mut out[start..start + BLOCK];
        let (x, y) = (&a[start..start + BLOCK], &b[start..start + BLOCK]);
        let (mut mask_a, mut mask_out) = (0u32, 0u32);
        for j in 0..BLOCK {
            o[j] = f(o[j], x[j], y[j]);
            mask_a |= ((x[j].abs() >= a_at_least) as u32) << j;
            mask_out |= ((o[j].abs() >= out_at_least) as u32) << j;
        }
        while mask_a != 0 {
            let j = mask_a.trailing_zeros() as usize;
            of_a.push(start + j, x[j].abs());
            mask_a &= mask_a - 1;
        }
        while mask_out != 0 {
            let j = mask_out.trailing_zeros() as usize;
            of_out.push(start + j, o[j].abs());
            mask_out &= mask_out - 1;
        }
    }
    for i in whole..out.len() {
        out[i] = f(out[i], a[i], b[i]);
        if a[i].abs() >= a_at_least {
            of_a.push(i, a[i].abs());
        }
        if out[i].abs() >= out_at_least {
            of_out.push(i, out[i].abs());
        }
    }
    Some((of_a, of_out))
}

/// `out[positions[j]] += values[j]` for every j, in order (LibTorch's `index_add_` on a flat
/// f32 vector: the same additions, one rounding each), when `out` and `values` are contiguous
/// flat f32 tensors in host memory, `positions` a contiguous int64 vector there of `values`'
/// length, every position within `out` and `out` sharing memory with neither; returns whether
/// it ran (`false`: nothing was changed). LibTorch's kernel checks and dispatches per element:
/// Denoise's receivers add 350,000 sent values a step on ResNet-18 at x16 (issue 37).
pub(crate) fn add_at(out: &mut Tensor, positions: &Tensor, values: &Tensor) -> bool {
    let (len, count) = (out.numel(), values.numel());
    let indices = positions.device() == Device::Cpu
        && positions.kind() == Kind::Int64
        && positions.is_contiguous()
        && positions.dim() == 1
        && positions.numel() == count;
    if !(host_f32(out, len) && host_f32(values, count) && indices) || count == 0 {
        return false;
    }
    let (o, pp, pv) = (out.data_ptr(), positions.data_ptr(), values.data_ptr());
    let overlaps = |p: *mut std::ffi::c_void, bytes: usize| {
        let (start, other) = (o as usize, p as usize);
        start < other + bytes && other < start + len * std::mem::size_of::<f32>()
    };
    if overlaps(pp, count * 8) || overlaps(pv, count * 4) {
        return false;
    }
    // SAFETY: `positions` and `values` are contiguous CPU vectors of `count` int64 and f32
    // values, `out` one of `len` f32 values (checked above); `out` is borrowed mutably and
    // overlaps neither (checked above).
    let (out, positions, values) = unsafe {
        (
            std::slice::from_raw_parts_mut(o as *mut f32, len),
            std::slice::from_raw_parts(pp as *const i64, count),
            std::slice::from_raw_parts(pv as *const f32, count),
        )
    };
    if positions.iter().any(|&p| p < 0 || p as usize >= len) {
        return false;
    }
    for (&p, &v) in positions.iter().zip(values) {
        out[p as usize] += v;
    }
    true
}

/// `out`, `a` and `b` as slices when all three are contiguous flat f32 tensors of one nonzero
/// length in host memory and `out` shares memory with neither.
fn host_slices<'t>(
    out: &'t mut Tensor,
    a: &'t Tensor,
    b: &'t Tensor,
) -> Option<(&'t mut [f32], &'t [f32], &'t [f32])> {
    let len = out.numel();
    if !(host_f32(out, len) && host_f32(a, len) && host_f32(b, len)) || len == 0 {
        return None;
    }
    let (o, pa, pb) = (out.data_ptr(), a.data_ptr(), b.data_ptr());
    let bytes = len * std::mem::size_of::<f32>();
    let overlaps = |p: *mut std::ffi::c_void| {
        let (start, other) = (o as usize, p as usize);
        start < other + bytes && other < start + bytes
    };
    if overlaps(pa) || overlaps(pb) {
        return None;
    }
    // SAFETY: all three are contiguous CPU tensors of `len` f32 values (checked above); `out`
    // is borrowed mutably for 't and its bytes overlap neither `a`'s nor `b`'s (checked above),
    // so the mutable slice aliases neither shared one.
    unsafe {
        Some((
            std::slice::from_raw_parts_mut(o as *mut f32, len),
            std::slice::from_raw_parts(pa as *const f32, len),
            std::slice::from_raw_parts(pb as *const f32, len),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fused_pass_equals_libtorchs_ops_and_declines_what_it_cannot_run() {
        let _serial = crate::test_serial();
        tch::manual_seed(21);
        let n = 10_007;
        let (a, b) = (
            Tensor::randn([n], (Kind::Float, Device::Cpu)),
            Tensor::randn([n], (Kind::Float, Device::Cpu)),
        );
        let start = Tensor::randn([n], (Kind::Float, Device::Cpu)) * 1e-3;
        // (a - out) + b, as sub then add.
        let mut out = start.copy();
        assert!(update(&mut out, &a, &b, |o, x, y| (x - o) + y));
        let expected = (&a - &start) + &b;
        assert!(crate::host::equal(&out, &expected));
        // (a - b) * 0.9, as sub then a scalar mul.
        let mut out = start.copy();
        assert!(update(&mut out, &a, &b, |_, x, y| (x - y) * 0.9f32));
        assert!(crate::host::equal(&out, &((&a - &b) * 0.9)));
        // Declined, nothing changed: another kind, another length, or `out` aliasing an input.
        let mut double = start.to_kind(Kind::Double);
        assert!(!update(&mut double, &a, &b, |o, _, _| o + 1.0));
        assert!(crate::host::equal(&double, &start.to_kind(Kind::Double)));
        let mut short = start.narrow(0, 0, 10).copy();
        assert!(!update(&mut short, &a, &b, |o, _, _| o + 1.0));
        let mut same = a.shallow_clone();
        assert!(!update(&mut same, &a, &b, |o, _, _| o + 1.0));
        assert!(crate::host::equal(&same, &a));
    }

    #[test]
    fn the_host_scatter_add_equals_index_add_and_declines_what_it_cannot_run() {
        let _serial = crate::test_serial();
        tch::manual_seed(22);
        let n = 5_003;
        let start = Tensor::randn([n], (Kind::Float, Device::Cpu));
        // Ascending positions as a top-k sends them, then repeated and unordered ones.
        let sorted = Tensor::randperm(n, (Kind::Int64, Device::Cpu))
            .narrow(0, 0, 700)
            .sort(0, false)
            .0;
        let repeated = Tensor::randint(n, [900], (Kind::Int64, Device::Cpu));
        for positions in [sorted, repeated] {
            let values = Tensor::randn([positions.numel() as i64], (Kind::Float, Device::Cpu));
            let mut out = start.copy();
            assert!(add_at(&mut out, &positions, &values));
            let expected = start.copy().index_add(0, &positions, &values);
            assert!(crate::host::equal(&out, &expected));
        }
        // Declined, nothing changed: a position outside, another kind, values aliasing `out`.
        let values = Tensor::ones([2], (Kind::Float, Device::Cpu));
        let mut out = start.copy();
        assert!(!add_at(&mut out, &Tensor::from_slice(&[0i64, n]), &values));
        assert!(!add_at(&mut out, &Tensor::from_slice(&[-1i64, 0]), &values));
        assert!(!add_at(&mut out, &Tensor::from_slice(&[0i32, 1]), &values));
        assert!(crate::host::equal(&out, &start));
        let alias = out.narrow(0, 0, 2);
        assert!(!add_at(&mut out, &Tensor::from_slice(&[3i64, 4]), &alias));
        assert!(crate::host::equal(&out, &start));
    }
}
