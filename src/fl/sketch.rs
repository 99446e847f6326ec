//! FL-CS's and FL-FREQ's compression of a flat update (`../shared/papers/compression-boosts-dp-fl.txt`):
//! shuffle with a permutation every participant derives from a shared seed, split into P equal
//! chunks (the last zero-padded), and keep the first m/P coefficients of each chunk's orthonormal
//! DCT-II. The map is linear, so the server may average compressed updates before it
//! reconstructs them (and secure aggregation can sum them). FL-FREQ inverts it by zero-filling the
//! dropped coefficients; FL-CS reconstructs by L1 recovery (not here yet).

use super::dct::{dct, idct};
use crate::error::{Error, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use tch::{Device, Tensor};

pub struct ChunkedDct {
    /// n, the update's length.
    pub length: i64,
    pub chunks: i64,
    /// Length of one chunk (n / P rounded up; the last chunk is zero-padded).
    pub chunk_length: i64,
    /// Coefficients kept per chunk (m / P).
    pub kept: i64,
    permutation: Tensor,
    inverse: Tensor,
}

impl ChunkedDct {
    /// Keeps about `ratio` n coefficients in `chunks` chunks; the permutation comes from `seed`.
    pub fn new(length: i64, ratio: f64, chunks: i64, seed: u64, device: Device) -> Result<Self> {
        if length < 1 || chunks < 1 || chunks > length || !(ratio > 0.0 && ratio <= 1.0) {
            return Err(Error::bad_value(
                "--ratio/--chunks",
                format!(
                    "ratio {ratio}, {chunks} chunks for {length} parameters: expected 0 < ratio <= 1 and 1 <= chunks <= parameters"
                ),
            ));
        }
        let chunk_length = (length + chunks - 1) / chunks;
        let kept = ((ratio * chunk_length as f64).round() as i64).clamp(1, chunk_length);
        let mut order: Vec<i64> = (0..length).collect();
        order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
        let permutation = Tensor::from_slice(&order).to_device(device);
        let inverse = permutation.argsort(0, false);
        Ok(ChunkedDct {
            length,
            chunks,
            chunk_length,
            kept,
            permutation,
            inverse,
        })
    }

    /// m, the coefficients sent: P x kept.
    pub fn message_length(&self) -> i64 {
        self.chunks * self.kept
    }

    /// The update shuffled and cut into zero-padded chunks, [P, L].
    pub fn shuffle(&self, update: &Tensor) -> Tensor {
        let shuffled = update.index_select(0, &self.permutation);
        let padding = self.chunks * self.chunk_length - self.length;
        shuffled
            .constant_pad_nd([0, padding])
            .view([self.chunks, self.chunk_length])
    }

    /// The inverse of `shuffle`: chunks [P, L] back to the update's order, [n].
    pub fn unshuffle(&self, chunks: &Tensor) -> Tensor {
        chunks
            .reshape([-1])
            .narrow(0, 0, self.length)
            .index_select(0, &self.inverse)
    }

    /// The message: the first `kept` DCT coefficients of every chunk, [P, kept].
    pub fn compress(&self, update: &Tensor) -> Tensor {
        dct(&self.shuffle(update)).narrow(1, 0, self.kept)
    }

    /// FL-FREQ's inversion: the dropped coefficients taken as zero.
    pub fn zero_fill(&self, message: &Tensor) -> Tensor {
        let padding = self.chunk_length - self.kept;
        let full = message.constant_pad_nd([0, padding]);
        self.unshuffle(&idct(&full))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    #[test]
    fn shuffling_is_exact_and_compression_is_linear() {
        tch::manual_seed(3);
        let n = 1003;
        let sketch = ChunkedDct::new(n, 0.1, 4, 42, Device::Cpu).unwrap();
        assert_eq!((sketch.chunk_length, sketch.kept), (251, 25));
        assert_eq!(sketch.message_length(), 100);
        let a = Tensor::randn([n], (Kind::Double, Device::Cpu));
        let b = Tensor::randn([n], (Kind::Double, Device::Cpu));
        assert_eq!(max_abs(&sketch.unshuffle(&sketch.shuffle(&a)), &a), 0.0);
        // The same seed gives every participant the same permutation.
        let again = ChunkedDct::new(n, 0.1, 4, 42, Device::Cpu).unwrap();
        assert!(again.shuffle(&a).equal(&sketch.shuffle(&a)));
        // Aggregating messages equals compressing the aggregate (weights as |D_k| / Σ|D|).
        let (wa, wb) = (0.3, 0.7);
        let aggregate = sketch.compress(&(&a * wa + &b * wb));
        let of_messages = sketch.compress(&a) * wa + sketch.compress(&b) * wb;
        assert!(max_abs(&aggregate, &of_messages) < 1e-12);
        // Keeping everything, zero-filling reconstructs exactly.
        let full = ChunkedDct::new(n, 1.0, 4, 42, Device::Cpu).unwrap();
        assert!(max_abs(&full.zero_fill(&full.compress(&a)), &a) < 1e-10);
        let bad = ChunkedDct::new(n, 0.0, 4, 42, Device::Cpu);
        assert!(bad.is_err());
    }
}
