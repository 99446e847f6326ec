//! The orthonormal DCT-II along the last dimension, in O(n log n) through one FFT (Makhoul 1980),
//! and its inverse (the orthonormal DCT-III), on the tensors' device.
//!
//! With s_0 = sqrt(1/n), s_k = sqrt(2/n): X_k = s_k Σ_j x_j cos(π (2j + 1) k / (2n)), i.e. X = D x
//! with D orthogonal (`dct_matrix`, the direct O(n²) form the tests compare against).
//!
//! Forward: v = (x_0, x_2, x_4, ..., x_5, x_3, x_1) (even entries, then odd ones reversed),
//! V = FFT(v), X_k = s_k Re(e^(-iπk/(2n)) V_k). Inverse: with Y_k = X_k / s_k and Y_n = 0,
//! V_k = e^(iπk/(2n)) (Y_k - i Y_(n-k)), v = Re(IFFT(V)), and x is v with the permutation undone.

use tch::{Device, Kind, Tensor};

/// The permutation v = x[order]: even indices ascending, then odd indices descending.
fn order(n: i64, device: Device) -> Tensor {
    let mut index: Vec<i64> = (0..n).step_by(2).collect();
    let odd: Vec<i64> = (1..n).step_by(2).collect();
    index.extend(odd.into_iter().rev());
    Tensor::from_slice(&index).to_device(device)
}

/// (cos θ_k, sin θ_k) with θ_k = πk/(2n), and the scales s_k, in `kind`.
fn twiddles(n: i64, kind: Kind, device: Device) -> (Tensor, Tensor, Tensor) {
    let k = Tensor::arange(n, (kind, device));
    let theta = k * (std::f64::consts::PI / (2.0 * n as f64));
    let scale = Tensor::full([n], (2.0 / n as f64).sqrt(), (kind, device));
    let _ = scale.get(0).fill_((1.0 / n as f64).sqrt());
    (theta.cos(), theta.sin(), scale)
}

/// Orthonormal DCT-II of `x` (real, f32 or f64) along its last dimension.
pub fn dct(x: &Tensor) -> Tensor {
    let n = *x.size().last().expect("at least one dimension");
    dct_first(x, n)
}

/// The first `kept` coefficients of the orthonormal DCT-II of `x` along its last dimension,
/// bit for bit `dct(x).narrow(-1, 0, kept)` (FL-FREQ's and FL-CS's sketch keeps only these).
///
/// When kept <= n / 2 + 1 the spectrum comes from the one-sided real FFT: LibTorch's full FFT of
/// a real input is that same one-sided transform with the other half filled in by conjugate
/// symmetry, so the kept bins are the same numbers at half the FFT's work and memory. Only the
/// kept bins get the twiddle factors.
pub fn dct_first(x: &Tensor, kept: i64) -> Tensor {
    let n = *x.size().last().expect("at least one dimension");
    assert!(
        (1..=n).contains(&kept),
        "dct_first: {kept} coefficients of a length-{n} transform"
    );
    let v = x.index_select(-1, &order(n, x.device()));
    let spectrum = if kept <= n / 2 + 1 {
        v.fft_rfft(None, -1, "backward")
    } else {
        v.fft_fft(None, -1, "backward")
    }
    .narrow(-1, 0, kept);
    let (cos, sin, scale) = twiddles(n, x.kind(), x.device());
    let (cos, sin, scale) = (
        cos.narrow(0, 0, kept),
        sin.narrow(0, 0, kept),
        scale.narrow(0, 0, kept),
    );
    (spectrum.real() * cos + spectrum.imag() * sin) * scale
}

/// Orthonormal inverse (DCT-III) of `y` along its last dimension: `idct(dct(x)) == x`.
pub fn idct(y: &Tensor) -> Tensor {
    let n = *y.size().last().expect("at least one dimension");
    idct_first(y, n)
}

/// The orthonormal inverse DCT of length `n` of `y` [.., kept], its first `kept` coefficients
/// (the others zero): bit for bit `idct` of `y` zero-padded to length n (FL-FREQ's zero
/// filling, FL-CS's adjoint), without forming the zeros' terms.
///
/// With Y the padded coefficients over the scales, the inverse FFT's input is
/// V_k = (Y_k cos θ_k + Y_(n-k) sin θ_k) + i (Y_k sin θ_k - Y_(n-k) cos θ_k) (Y_n = 0). Y_k is
/// nonzero only for k < kept and Y_(n-k) only for k > n - kept, so when these two column ranges
/// do not meet (2 kept <= n) every other V_k is 0 * cos + 0 * sin = +0 exactly, as the padded
/// computation gives (cos, sin >= 0 on [0, π/2)); only the two ranges are computed.
pub fn idct_first(y: &Tensor, n: i64) -> Tensor {
    let kept = *y.size().last().expect("at least one dimension");
    assert!(
        (1..=n).contains(&kept),
        "idct_first: {kept} coefficients of a length-{n} transform"
    );
    let (cos, sin, scale) = twiddles(n, y.kind(), y.device());
    let spectrum = if 2 * kept <= n {
        let plain = y / scale.narrow(0, 0, kept);
        let mut size = y.size();
        *size.last_mut().expect("at least one dimension") = n;
        let complex_kind = match y.kind() {
            Kind::Double => Kind::ComplexDouble,
            _ => Kind::ComplexFloat,
        };
        let spectrum = Tensor::zeros(size.as_slice(), (complex_kind, y.device()));
        // Columns 0..kept: Y_k with Y_(n-k) = 0 (k = 0 is Y_n = 0; k >= 1 has n - k >= kept).
        let (c, s) = (cos.narrow(0, 0, kept), sin.narrow(0, 0, kept));
        let zero = plain.zeros_like();
        let real = &plain * &c + &zero * &s;
        let imag = &plain * &s - &zero * &c;
        spectrum
            .narrow(-1, 0, kept)
            .copy_(&Tensor::complex(&real, &imag));
        if kept > 1 {
            // Columns n-kept+1..n: Y_k = 0 with Y_(n-k) for n - k = kept-1 down to 1.
            let mirrored = plain.narrow(-1, 1, kept - 1).flip([-1]);
            let (c, s) = (
                cos.narrow(0, n - kept + 1, kept - 1),
                sin.narrow(0, n - kept + 1, kept - 1),
            );
            let zero = mirrored.zeros_like();
            let real = &zero * &c + &mirrored * &s;
            let imag = &zero * &s - &mirrored * &c;
            spectrum
                .narrow(-1, n - kept + 1, kept - 1)
                .copy_(&Tensor::complex(&real, &imag));
        }
        spectrum
    } else {
        let padded = if kept < n {
            y.constant_pad_nd([0, n - kept])
        } else {
            y.shallow_clone()
        };
        let plain = padded / scale;
        // Y_(n-k) for k = 0..n-1, with Y_n = 0.
        let zero = plain.narrow(-1, 0, 1).zeros_like();
        let mirrored = Tensor::cat(&[zero, plain.narrow(-1, 1, n - 1).flip([-1])], -1);
        let real = &plain * &cos + &mirrored * &sin;
        let imag = &plain * &sin - &mirrored * &cos;
        Tensor::complex(&real, &imag)
    };
    let v = spectrum.fft_ifft(None, -1, "backward").real();
    // x = v with the permutation undone: x_(2j) = v_j, x_(2j+1) = v_(n-1-j), by two strided
    // copies (the same values as a gather by the inverse permutation, faster on the CPU).
    let half = n - n / 2;
    let x = Tensor::empty(v.size().as_slice(), (v.kind(), v.device()));
    let dim = (v.dim() - 1) as i64;
    x.slice(dim, 0, n, 2).copy_(&v.narrow(dim, 0, half));
    if n > 1 {
        x.slice(dim, 1, n, 2)
            .copy_(&v.narrow(dim, half, n - half).flip([dim]));
    }
    x
}

/// Rows `rows` (int64 indices in 0..n) of the n x n orthonormal DCT-II matrix, [rows, n], in
/// `kind` on `device`; built in f64 and converted. What `chunked_dct` multiplies by when few
/// coefficients of each chunk are kept: one matrix product then costs less than the FFT path.
pub fn dct_rows(rows: &Tensor, n: i64, kind: Kind, device: Device) -> Tensor {
    let k = rows.to_kind(Kind::Double).to_device(device).unsqueeze(1);
    let j = Tensor::arange(n, (Kind::Double, device)).unsqueeze(0);
    let angle = (j * 2.0 + 1.0) * &k * (std::f64::consts::PI / (2.0 * n as f64));
    // sqrt(1/n) for row 0, sqrt(2/n) for the others.
    let first = Tensor::full([1, 1], (1.0 / n as f64).sqrt(), (Kind::Double, device));
    let scale = first.where_scalarother(&k.eq(0.0), (2.0 / n as f64).sqrt());
    (angle.cos() * scale).to_kind(kind)
}

/// The n x n orthonormal DCT-II matrix D (X = D x), built directly: O(n²), for tests and small n.
pub fn dct_matrix(n: i64, kind: Kind) -> Tensor {
    let k = Tensor::arange(n, (kind, Device::Cpu)).unsqueeze(1);
    let j = Tensor::arange(n, (kind, Device::Cpu)).unsqueeze(0);
    let angle = (j * 2.0 + 1.0) * k * (std::f64::consts::PI / (2.0 * n as f64));
    let (_, _, scale) = twiddles(n, kind, Device::Cpu);
    angle.cos() * scale.unsqueeze(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
        crate::host::f64_scalar(&(a - b).abs().max())
    }

    #[test]
    fn chosen_rows_are_the_matrix_rows() {
        for n in [1, 2, 5, 33] {
            let rows = Tensor::from_slice(&[0i64, n - 1, n / 2]);
            let chosen = dct_rows(&rows, n, Kind::Double, Device::Cpu);
            let full = dct_matrix(n, Kind::Double).index_select(0, &rows);
            assert!(max_abs(&chosen, &full) < 1e-12, "n {n}");
        }
    }

    #[test]
    fn the_matrix_is_orthonormal() {
        for n in [1, 2, 5, 8, 33] {
            let d = dct_matrix(n, Kind::Double);
            let eye = Tensor::eye(n, (Kind::Double, Device::Cpu));
            assert!(max_abs(&d.mm(&d.tr()), &eye) < 1e-12, "n {n}");
        }
    }

    #[test]
    fn the_fft_path_equals_the_direct_one_and_inverts() {
        let _serial = crate::test_serial();
        tch::manual_seed(7);
        for n in [1, 2, 3, 8, 17, 64, 1000] {
            let x = Tensor::randn([4, n], (Kind::Double, Device::Cpu));
            let direct = x.mm(&dct_matrix(n, Kind::Double).tr());
            let fast = dct(&x);
            assert!(max_abs(&fast, &direct) < 1e-9, "n {n}: dct");
            assert!(max_abs(&idct(&fast), &x) < 1e-9, "n {n}: idct");
            // Orthonormal: energy is kept.
            let energy = |t: &Tensor| crate::host::f64_scalar(&t.square().sum(Kind::Double));
            assert!((energy(&fast) - energy(&x)).abs() < 1e-9 * energy(&x));
        }
        // f32 inputs stay f32 and agree to single precision.
        let x = Tensor::randn([3, 100], (Kind::Float, Device::Cpu));
        let fast = dct(&x);
        assert_eq!(fast.kind(), Kind::Float);
        let direct = x
            .to_kind(Kind::Double)
            .mm(&dct_matrix(100, Kind::Double).tr());
        assert!(max_abs(&fast.to_kind(Kind::Double), &direct) < 1e-4);
    }

    /// The pre-`idct_first` inverse, kept as the reference: the coefficients zero-padded to n,
    /// every V_k formed, the permutation undone by a gather.
    fn idct_padded(y: &Tensor, n: i64) -> Tensor {
        let kept = *y.size().last().unwrap();
        let (cos, sin, scale) = twiddles(n, y.kind(), y.device());
        let plain = y.constant_pad_nd([0, n - kept]) / scale;
        let zero = plain.narrow(-1, 0, 1).zeros_like();
        let mirrored = Tensor::cat(&[zero, plain.narrow(-1, 1, n - 1).flip([-1])], -1);
        let real = &plain * &cos + &mirrored * &sin;
        let imag = &plain * &sin - &mirrored * &cos;
        let v = Tensor::complex(&real, &imag)
            .fft_ifft(None, -1, "backward")
            .real();
        v.index_select(-1, &order(n, y.device()).argsort(-1, false))
    }

    #[test]
    fn the_first_coefficients_and_their_inverse_are_bit_for_bit_the_full_ones() {
        let _serial = crate::test_serial();
        tch::manual_seed(11);
        for kind in [Kind::Float, Kind::Double] {
            for n in [2, 3, 8, 17, 64, 1000, 1024] {
                let x = Tensor::randn([5, n], (kind, Device::Cpu));
                let full = dct(&x);
                for kept in [1, 2, n / 4, n / 2, n / 2 + 1, n / 2 + 2, n - 1, n] {
                    if !(1..=n).contains(&kept) {
                        continue;
                    }
                    let first = dct_first(&x, kept);
                    assert!(
                        crate::host::equal(&first, &full.narrow(-1, 0, kept)),
                        "{kind:?} n {n} kept {kept}: dct_first"
                    );
                    assert!(
                        crate::host::equal(&idct_first(&first, n), &idct_padded(&first, n)),
                        "{kind:?} n {n} kept {kept}: idct_first"
                    );
                }
            }
        }
    }
}
