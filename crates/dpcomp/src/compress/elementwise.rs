//! Fused elementwise updates of flat f32 tensors in host memory: one pass where LibTorch's ops
//! take two (Denoise's passes over the model are bound by memory bandwidth on a CPU).
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
    let len = out.numel();
    if !(host_f32(out, len) && host_f32(a, len) && host_f32(b, len)) || len == 0 {
        return false;
    }
    let (o, pa, pb) = (out.data_ptr(), a.data_ptr(), b.data_ptr());
    let bytes = len * std::mem::size_of::<f32>();
    let overlaps = |p: *mut std::ffi::c_void| {
        let (start, other) = (o as usize, p as usize);
        start < other + bytes && other < start + bytes
    };
    if overlaps(pa) || overlaps(pb) {
        return false;
    }
    // SAFETY: all three are contiguous CPU tensors of `len` f32 values (checked above); `out`
    // is borrowed mutably and its bytes overlap neither `a`'s nor `b`'s (checked above), so
    // the mutable slice aliases neither shared one.
    let (out, a, b) = unsafe {
        (
            std::slice::from_raw_parts_mut(o as *mut f32, len),
            std::slice::from_raw_parts(pa as *const f32, len),
            std::slice::from_raw_parts(pb as *const f32, len),
        )
    };
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = f(*o, x, y);
    }
    true
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
}
