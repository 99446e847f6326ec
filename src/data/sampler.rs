//! Which examples each step of an epoch uses. Randomness comes from LibTorch's generator, which
//! the trainer seeds per epoch, so a resumed run draws the same batches.

use tch::{Device, Kind, Tensor};

/// Poisson sampling (Abadi et al. 2016; what the accountants assume): for each of `steps` steps,
/// every one of the `n` examples is included independently with probability `q`. Batches vary in
/// size and may be empty.
pub fn poisson_batches(n: i64, q: f64, steps: usize) -> Vec<Tensor> {
    (0..steps)
        .map(|_| {
            let mask = Tensor::rand([n], (Kind::Float, Device::Cpu)).lt(q);
            mask.nonzero().squeeze_dim(1)
        })
        .collect()
}

/// A random permutation cut into consecutive batches of `batch_size` (the last one shorter).
pub fn shuffled_batches(n: i64, batch_size: i64) -> Vec<Tensor> {
    let order = Tensor::randperm(n, (Kind::Int64, Device::Cpu));
    (0..n)
        .step_by(batch_size as usize)
        .map(|start| order.narrow(0, start, batch_size.min(n - start)))
        .collect()
}
