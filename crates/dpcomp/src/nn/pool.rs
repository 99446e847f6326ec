//! Average pooling over 2x2 windows with stride 2: the paper's CIFAR-10 CNN pools after each of
//! its three blocks (`models::cifar_cnn`).
//!
//! On the CPU, LibTorch's kernels for it (`avg_pool2d` and its backward) recompute each window's
//! bounds and divisor for every output element: on one core, batch 128, the CNN's three pools
//! took 21.6 ms of its 89 ms non-private step, forward and backward (PyTorch 2.11 on the same
//! shapes and a `perf` profile of `dpcomp bench dp`, 2026-12-06). `avg_pool2x2` runs a loop
//! written for this one window (`crates/dpcomp/src/avg_pool.cpp`, an autograd function) with LibTorch's
//! arithmetic bit for bit, tested against it; elsewhere (CUDA, other kinds) it is LibTorch's
//! `avg_pool2d`.

use super::input::{kernel_error, wrong_shape};
use crate::error::Result;
use tch::Tensor;

extern "C" {
    fn dpcomp_avg_pool2x2(input: *const torch_sys::C_tensor) -> *mut torch_sys::C_tensor;
}

/// The average of each 2x2 window at stride 2 of `xs` [B, C, H, W], H and W at least 2 (no
/// padding; an odd last row or column is dropped): [B, C, H / 2, W / 2], equal bit for bit to
/// `xs.avg_pool2d([2, 2], [2, 2], [0, 0], false, true, None)`, forward and backward. An error
/// names the input's shape and what was expected.
///
/// ```
/// use tch::{Kind, Tensor};
///
/// let xs = Tensor::arange(16, (Kind::Float, tch::Device::Cpu)).view([1, 1, 4, 4]);
/// let pooled = dpcomp::nn::avg_pool2x2(&xs)?;
/// assert_eq!(Vec::<f32>::try_from(pooled.flatten(0, -1)).unwrap(), [2.5, 4.5, 10.5, 12.5]);
/// # Ok::<(), dpcomp::Error>(())
/// ```
pub fn avg_pool2x2(xs: &Tensor) -> Result<Tensor> {
    const LAYER: &str = "AvgPool2x2";
    if xs.dim() != 4 {
        return Err(wrong_shape(LAYER, xs, "[batch, channels, height, width]"));
    }
    if xs.size()[2] < 2 || xs.size()[3] < 2 {
        return Err(wrong_shape(LAYER, xs, "height and width at least 2"));
    }
    // SAFETY: a valid tensor handle for the duration of the call; the result is a new handle
    // this side owns, or null when the input is not a float32 CPU tensor (or on error).
    let pooled = unsafe { dpcomp_avg_pool2x2(xs.as_ptr()) };
    if pooled.is_null() {
        return xs
            .f_avg_pool2d([2, 2], [2, 2], [0, 0], false, true, None::<i64>)
            .map_err(|e| kernel_error(LAYER, e));
    }
    // SAFETY: a valid, owned handle.
    Ok(unsafe { Tensor::from_ptr(pooled) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    fn libtorch(xs: &Tensor) -> Tensor {
        xs.avg_pool2d([2, 2], [2, 2], [0, 0], false, true, None::<i64>)
    }

    /// `count` values from a fixed linear congruential sequence: multiples of 0.1 in
    /// [-1.6, 1.6], so that windows hold ties, zeros and sums that round, with every eighth value
    /// a negative zero.
    fn values(count: i64, seed: u64) -> Vec<f32> {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..count)
            .map(|k| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                if k % 8 == 3 {
                    -0.0
                } else {
                    ((state >> 40) % 33) as f32 * 0.1 - 1.6 + (state >> 61) as f32 * 1e-3
                }
            })
            .collect()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        crate::host::to_vec_f32(&t.flatten(0, -1))
            .expect("float values")
            .into_iter()
            .map(f32::to_bits)
            .collect()
    }

    /// Outputs and input gradients of `avg_pool2x2` and LibTorch's kernel on the same values,
    /// compared as bit patterns (so that -0.0 against 0.0 counts as a difference).
    fn assert_same_bits(shape: [i64; 4]) {
        let count = shape.iter().product::<i64>();
        let xs = Tensor::from_slice(&values(count, 1)).view(shape);
        let out_shape = [shape[0], shape[1], shape[2] / 2, shape[3] / 2];
        let grad_out =
            Tensor::from_slice(&values(out_shape.iter().product::<i64>(), 2)).view(out_shape);
        let mut results = Vec::new();
        for ours in [true, false] {
            let x = xs.detach().set_requires_grad(true);
            let y = if ours {
                avg_pool2x2(&x).expect("valid input")
            } else {
                libtorch(&x)
            };
            (&y * &grad_out).sum(Kind::Float).backward();
            results.push((bits(&y), bits(&x.grad())));
        }
        assert_eq!(
            results[0].0, results[1].0,
            "forward values, shape {shape:?}"
        );
        assert_eq!(
            results[0].1, results[1].1,
            "input gradients, shape {shape:?}"
        );
    }

    #[test]
    fn equals_libtorch_bit_for_bit_forward_and_backward() {
        for shape in [
            [2, 3, 4, 4],
            [2, 3, 5, 4],
            [3, 2, 6, 7],
            [1, 1, 2, 2],
            [4, 8, 13, 13],
            [2, 4, 30, 30],
            [0, 3, 4, 4],
        ] {
            assert_same_bits(shape);
        }
    }

    #[test]
    fn non_contiguous_and_other_kinds_equal_libtorch() {
        let xs = Tensor::from_slice(&values(2 * 3 * 6 * 8, 3)).view([2, 3, 6, 8]);
        let transposed = xs.transpose(2, 3);
        assert_eq!(
            bits(&avg_pool2x2(&transposed).unwrap()),
            bits(&libtorch(&transposed))
        );
        let double = xs.to_kind(Kind::Double);
        assert!(crate::host::equal(
            &avg_pool2x2(&double).unwrap(),
            &libtorch(&double)
        ));
        assert_eq!(avg_pool2x2(&xs).unwrap().device(), Device::Cpu);
    }

    #[test]
    fn without_autograd_the_output_has_no_graph() {
        let xs = Tensor::from_slice(&values(16, 4)).view([1, 1, 4, 4]);
        assert!(!avg_pool2x2(&xs).unwrap().requires_grad());
        let x = xs.set_requires_grad(true);
        let y = tch::no_grad(|| avg_pool2x2(&x).unwrap());
        assert!(!y.requires_grad());
    }

    #[test]
    fn wrong_shapes_are_errors_naming_the_shape() {
        let flat = Tensor::zeros([2, 3, 4], (Kind::Float, Device::Cpu));
        let message = avg_pool2x2(&flat).unwrap_err().to_string();
        assert!(
            message.contains("AvgPool2x2") && message.contains("[2, 3, 4]"),
            "{message}"
        );
        let thin = Tensor::zeros([2, 3, 1, 4], (Kind::Float, Device::Cpu));
        let message = avg_pool2x2(&thin).unwrap_err().to_string();
        assert!(message.contains("height and width at least 2"), "{message}");
    }
}
