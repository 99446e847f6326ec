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
            crate::host::nonzero(&mask).squeeze_dim(1)
        })
        .collect()
}

/// How many of `n` examples rank `rank` of `workers` holds: those with index ≡ rank (mod W).
pub fn shard_len(n: i64, rank: i64, workers: i64) -> i64 {
    (n - rank + workers - 1).div_euclid(workers).max(0)
}

/// Rank `rank` of `workers`' Poisson batches: every example of its shard (indices
/// ≡ rank mod W) in each of `steps` batches independently with probability `q` (the global
/// rate), as indices into the whole dataset. Each example is in exactly one shard, so the union
/// of the W ranks' batches of a step is a Poisson sample of all `n` at rate q, which is what the
/// accountant assumes. With W = 1 these are `poisson_batches`, draw for draw.
pub fn shard_poisson_batches(n: i64, rank: i64, workers: i64, q: f64, steps: usize) -> Vec<Tensor> {
    poisson_batches(shard_len(n, rank, workers), q, steps)
        .into_iter()
        .map(|local| local * workers + rank)
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
