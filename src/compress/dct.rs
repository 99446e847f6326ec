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
    let v = x.index_select(-1, &order(n, x.device()));
    let spectrum = v.fft_fft(None, -1, "backward");
    let (cos, sin, scale) = twiddles(n, x.kind(), x.device());
    (spectrum.real() * cos + spectrum.imag() * sin) * scale
}

/// Orthonormal inverse (DCT-III) of `y` along its last dimension: `idct(dct(x)) == x`.
pub fn idct(y: &Tensor) -> Tensor {
    let n = *y.size().last().expect("at least one dimension");
    let (cos, sin, scale) = twiddles(n, y.kind(), y.device());
    let plain = y / scale;
    // Y_(n-k) for k = 0..n-1, with Y_n = 0.
    let zero = plain.narrow(-1, 0, 1).zeros_like();
    let mirrored = Tensor::cat(&[zero, plain.narrow(-1, 1, n - 1).flip([-1])], -1);
    let real = &plain * &cos + &mirrored * &sin;
    let imag = &plain * &sin - &mirrored * &cos;
    let v = Tensor::complex(&real, &imag)
        .fft_ifft(None, -1, "backward")
        .real();
    let inverse = order(n, y.device()).argsort(-1, false);
    v.index_select(-1, &inverse)
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
}
