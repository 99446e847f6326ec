//! FL-CS's and FL-FREQ's compression of a flat update (Kerkouche, Ács, Castelluccia, Genevès, "Compression Boosts Differentially Private Federated Learning", 2021):
//! shuffle with a permutation every participant derives from a shared seed, split into P equal
//! chunks (the last zero-padded), and keep the first m/P coefficients of each chunk's orthonormal
//! DCT-II. The map is linear, so the server may average compressed updates before it
//! reconstructs them (and secure aggregation can sum them). FL-FREQ inverts it by zero-filling the
//! dropped coefficients; FL-CS reconstructs by L1 recovery (`owlqn`, through `Measurement`).

use super::dct::{dct, dct_first, dct_rows, idct, idct_first};
use super::owlqn::Measurement;
use crate::error::{Error, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use tch::{Device, Tensor};

/// Which DCT coefficients of a chunk are kept: the first m/P (the paper's choice, low
/// frequencies) or a shared-seed random subset of that size (the classic compressive-sensing
/// partial Fourier ensemble), the same for every chunk and round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum DctRows {
    /// The first m/P coefficients of each chunk, its lowest frequencies (`rows=first`).
    First,
    /// A random subset of m/P coefficients drawn from the shared seed (`rows=random`).
    Random,
}

/// The linear map of FL-FREQ and FL-CS for updates of one length n: optional shared shuffle, P
/// chunks, the kept DCT-II coefficients of each (`compress`), and its adjoint (`zero_fill`). As
/// a `Measurement` it is the sensing matrix A of FL-CS's reconstruction (`owlqn`).
///
/// ```
/// use dpcomp::compress::chunked_dct::{ChunkedDct, DctRows};
/// use tch::{Device, Kind, Tensor};
/// let sketch = ChunkedDct::new(1000, 0.1, 4, Some(7), DctRows::First, Device::Cpu)?;
/// assert_eq!((sketch.chunk_length, sketch.kept, sketch.message_length()), (250, 25, 100));
/// // A constant update (shuffled, still constant) lives in each chunk's first coefficient:
/// // zero filling the 100 kept coefficients gives it back.
/// let update = Tensor::ones([1000], (Kind::Double, Device::Cpu));
/// let back = sketch.zero_fill(&sketch.compress(&update));
/// assert!((back - &update).abs().max().double_value(&[]) < 1e-9);
/// # Ok::<(), dpcomp::error::Error>(())
/// ```
pub struct ChunkedDct {
    /// n, the update's length.
    pub length: i64,
    /// P, the number of chunks (at most n).
    pub chunks: i64,
    /// Length of one chunk (n / P rounded up; the last chunk is zero-padded).
    pub chunk_length: i64,
    /// Coefficients kept per chunk (m / P).
    pub kept: i64,
    /// Which coefficients of each chunk are kept.
    pub rows: DctRows,
    /// The kept coefficients' indices when they are not the first ones.
    row_index: Option<Tensor>,
    /// The shared permutation and its inverse; `None` for FL-FREQ, which does not shuffle.
    permutation: Option<(Tensor, Tensor)>,
    /// The first `kept` rows of the chunk's DCT-II matrix, [kept, chunk_length] in f64, when
    /// the first rows are kept (FL-FREQ) and few enough that a matrix product beats the FFT path
    /// (`MATRIX_MAX_ROWS`, `MATRIX_MAX_ELEMENTS`). Its values equal the FFT path's to rounding,
    /// not bit for bit.
    matrix: Option<Tensor>,
}

/// Most kept coefficients per chunk for which `ChunkedDct` multiplies by the kept DCT rows
/// instead of running the FFT path: on one CPU core, ResNet-18's 11.2M gradient values in chunks
/// of 1024 keeping 64 (FL-FREQ at rate 16) take about 12 ms to compress and 38 ms to zero-fill
/// as matrix products, against about 120 ms for the FFT path's index shuffles, complex spectra and
/// transforms; at 256 kept the two cost about the same.
pub const MATRIX_MAX_ROWS: i64 = 128;

/// Largest kept-rows matrix (elements) `ChunkedDct` holds: 2^18 f64 values are 2 MiB.
pub const MATRIX_MAX_ELEMENTS: i64 = 1 << 18;

impl ChunkedDct {
    /// Keeps about `ratio` n coefficients in `chunks` chunks. With `shuffle_seed` the update is
    /// first permuted by the permutation that seed gives every participant; `rows` says which
    /// coefficients are kept (random rows come from the same seed, or 0 without one).
    pub fn new(
        length: i64,
        ratio: f64,
        chunks: i64,
        shuffle_seed: Option<u64>,
        rows: DctRows,
        device: Device,
    ) -> Result<Self> {
        if length < 1 || chunks < 1 || chunks > length || !(ratio > 0.0 && ratio <= 1.0) {
            return Err(Error::bad_value(
                "ratio/chunks",
                format!(
                    "ratio {ratio}, {chunks} chunks for {length} parameters: expected 0 < ratio <= 1 and 1 <= chunks <= parameters"
                ),
            ));
        }
        let chunk_length = (length + chunks - 1) / chunks;
        let kept = ((ratio * chunk_length as f64).round() as i64).clamp(1, chunk_length);
        let mut rng = rand::rngs::StdRng::seed_from_u64(shuffle_seed.unwrap_or(0));
        let permutation = shuffle_seed.map(|_| {
            let mut order: Vec<i64> = (0..length).collect();
            order.shuffle(&mut rng);
            let permutation = Tensor::from_slice(&order).to_device(device);
            let inverse = permutation.argsort(0, false);
            (permutation, inverse)
        });
        let row_index = match rows {
            DctRows::First => None,
            DctRows::Random => {
                let mut all: Vec<i64> = (0..chunk_length).collect();
                all.shuffle(&mut rng);
                let mut chosen = all[..kept as usize].to_vec();
                chosen.sort();
                Some(Tensor::from_slice(&chosen).to_device(device))
            }
        };
        // The first rows only: FL-CS's random rows stay on the FFT path, whose rounding its
        // iterative reconstruction (and tests/federated/fl.rs's bit-identical runs) is pinned to.
        let matrix = (row_index.is_none()
            && kept <= MATRIX_MAX_ROWS
            && kept * chunk_length <= MATRIX_MAX_ELEMENTS)
            .then(|| {
                let rows = Tensor::arange(kept, (tch::Kind::Int64, device));
                dct_rows(&rows, chunk_length, tch::Kind::Double, device)
            });
        Ok(ChunkedDct {
            length,
            chunks,
            chunk_length,
            kept,
            rows,
            row_index,
            permutation,
            matrix,
        })
    }

    /// m, the coefficients sent: P x kept.
    pub fn message_length(&self) -> i64 {
        self.chunks * self.kept
    }

    /// The update (shuffled when this sketch shuffles) cut into zero-padded chunks, [P, L].
    pub fn shuffle(&self, update: &Tensor) -> Tensor {
        let shuffled = match &self.permutation {
            Some((permutation, _)) => update.index_select(0, permutation),
            None => update.shallow_clone(),
        };
        let padding = self.chunks * self.chunk_length - self.length;
        shuffled
            .constant_pad_nd([0, padding])
            .view([self.chunks, self.chunk_length])
    }

    /// The inverse of `shuffle`: chunks [P, L] back to the update's order, \[n\].
    pub fn unshuffle(&self, chunks: &Tensor) -> Tensor {
        let flat = chunks.reshape([-1]).narrow(0, 0, self.length);
        match &self.permutation {
            Some((_, inverse)) => flat.index_select(0, inverse),
            None => flat,
        }
    }

    /// The message: the kept DCT coefficients of every chunk, flattened to \[m\].
    pub fn compress(&self, update: &Tensor) -> Tensor {
        self.apply(&self.shuffle(update)).reshape([-1])
    }

    /// `compress` of the update given as its parts (the parameters, flattened in order), the
    /// same values. Without a shuffle the parts and the last chunk's zero padding are joined
    /// into the chunks in one copy (instead of flattening, then padding: a second copy of all
    /// n values); with one, `compress(&flatten(parts))`.
    pub fn compress_parts(&self, parts: &[Tensor]) -> Tensor {
        if self.permutation.is_some() || parts.is_empty() {
            return self.compress(&super::codec::flatten(parts));
        }
        let mut pieces: Vec<Tensor> = parts.iter().map(|t| t.reshape([-1])).collect();
        let total: i64 = pieces.iter().map(|t| t.numel() as i64).sum();
        assert_eq!(
            total, self.length,
            "compress_parts: the parts hold {total} values, the sketch expects {}",
            self.length
        );
        let padding = self.chunks * self.chunk_length - self.length;
        if padding > 0 {
            pieces.push(Tensor::zeros(
                [padding],
                (pieces[0].kind(), pieces[0].device()),
            ));
        }
        let chunks = Tensor::cat(&pieces, 0).view([self.chunks, self.chunk_length]);
        self.apply(&chunks).reshape([-1])
    }

    /// A message \[m\] as the measurements of each chunk, [P, kept].
    pub fn measurements(&self, message: &Tensor) -> Tensor {
        message.view([self.chunks, self.kept])
    }

    /// Zero-filling inversion (FL-FREQ's): the dropped coefficients taken as zero. Since the
    /// kept rows are orthonormal, this is also Aᵀy, the least-norm solution of A s = y.
    pub fn zero_fill(&self, message: &Tensor) -> Tensor {
        self.unshuffle(&self.adjoint(&self.measurements(message)))
    }
}

/// A chunk's sensing matrix: the kept rows of the orthonormal DCT-II (rows orthonormal, so
/// ‖A‖ = 1 and A Aᵀ = I).
impl Measurement for ChunkedDct {
    /// Few first rows kept (`matrix`): one product with them. Otherwise, the first
    /// rows: only the kept coefficients are formed (`dct_first`); random rows: the whole DCT,
    /// then the chosen coefficients.
    fn apply(&self, chunks: &Tensor) -> Tensor {
        if let Some(matrix) = &self.matrix {
            return chunks.matmul(&matrix.to_kind(chunks.kind()).tr());
        }
        match &self.row_index {
            None => dct_first(chunks, self.kept),
            Some(index) => dct(chunks).index_select(1, index),
        }
    }

    /// Few first rows kept (`matrix`): one product with their transpose. Otherwise,
    /// the first rows: the inverse DCT of the kept coefficients, the rest zero (`idct_first`);
    /// random rows: the coefficients put in their rows of a zero [P, L], then the inverse DCT.
    fn adjoint(&self, measurements: &Tensor) -> Tensor {
        if let Some(matrix) = &self.matrix {
            return measurements.matmul(&matrix.to_kind(measurements.kind()));
        }
        match &self.row_index {
            None => idct_first(measurements, self.chunk_length),
            Some(index) => {
                let full = measurements.new_zeros(
                    [measurements.size()[0], self.chunk_length],
                    (measurements.kind(), measurements.device()),
                );
                idct(&full.index_copy(1, index, measurements))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
        crate::host::f64_scalar(&(a - b).abs().max())
    }

    #[test]
    fn shuffling_is_exact_and_compression_is_linear() {
        let _serial = crate::test_serial();
        tch::manual_seed(3);
        let n = 1003;
        let sketch = ChunkedDct::new(n, 0.1, 4, Some(42), DctRows::First, Device::Cpu).unwrap();
        assert_eq!((sketch.chunk_length, sketch.kept), (251, 25));
        assert_eq!(sketch.message_length(), 100);
        let a = Tensor::randn([n], (Kind::Double, Device::Cpu));
        let b = Tensor::randn([n], (Kind::Double, Device::Cpu));
        assert_eq!(max_abs(&sketch.unshuffle(&sketch.shuffle(&a)), &a), 0.0);
        // The same seed gives every participant the same permutation.
        let again = ChunkedDct::new(n, 0.1, 4, Some(42), DctRows::First, Device::Cpu).unwrap();
        assert!(crate::host::equal(&again.shuffle(&a), &sketch.shuffle(&a)));
        // Aggregating messages equals compressing the aggregate (weights as |D_k| / Σ|D|).
        let (wa, wb) = (0.3, 0.7);
        let aggregate = sketch.compress(&(&a * wa + &b * wb));
        let of_messages = sketch.compress(&a) * wa + sketch.compress(&b) * wb;
        assert!(max_abs(&aggregate, &of_messages) < 1e-12);
        // Keeping everything, zero-filling reconstructs exactly.
        let full = ChunkedDct::new(n, 1.0, 4, Some(42), DctRows::First, Device::Cpu).unwrap();
        assert!(max_abs(&full.zero_fill(&full.compress(&a)), &a) < 1e-10);
        let bad = ChunkedDct::new(n, 0.0, 4, Some(42), DctRows::First, Device::Cpu);
        assert!(bad.is_err());
    }

    #[test]
    fn the_kept_rows_product_equals_the_fft_path() {
        let _serial = crate::test_serial();
        tch::manual_seed(5);
        let random = ChunkedDct::new(5000, 1.0 / 16.0, 5, Some(9), DctRows::Random, Device::Cpu);
        assert!(
            random.unwrap().matrix.is_none(),
            "FL-CS's rows stay on the FFT path"
        );
        for shuffle in [None, Some(9)] {
            let rows = DctRows::First;
            let sketch = ChunkedDct::new(5000, 1.0 / 16.0, 5, shuffle, rows, Device::Cpu).unwrap();
            assert!(sketch.matrix.is_some());
            let x = Tensor::randn([5, 1000], (Kind::Double, Device::Cpu));
            let fft = match &sketch.row_index {
                None => dct_first(&x, sketch.kept),
                Some(index) => dct(&x).index_select(1, index),
            };
            assert!(max_abs(&sketch.apply(&x), &fft) < 1e-10);
            let y = Tensor::randn([5, sketch.kept], (Kind::Double, Device::Cpu));
            let back = match &sketch.row_index {
                None => idct_first(&y, 1000),
                Some(index) => idct(
                    &y.new_zeros([5, 1000], (Kind::Double, Device::Cpu))
                        .index_copy(1, index, &y),
                ),
            };
            assert!(max_abs(&sketch.adjoint(&y), &back) < 1e-10);
        }
    }

    #[test]
    fn partial_dct_rows_are_orthonormal_and_adjoint() {
        let _serial = crate::test_serial();
        tch::manual_seed(4);
        let n = 600;
        for (seed, rows) in [(None, DctRows::First), (Some(7), DctRows::Random)] {
            let sketch = ChunkedDct::new(n, 0.2, 3, seed, rows, Device::Cpu).unwrap();
            let s = Tensor::randn([3, 200], (Kind::Double, Device::Cpu));
            let r = Tensor::randn([3, 40], (Kind::Double, Device::Cpu));
            // <A s, r> = <s, Aᵀ r> and A Aᵀ = I.
            let left = crate::host::f64_scalar(&(sketch.apply(&s) * &r).sum(Kind::Double));
            let right = crate::host::f64_scalar(&(&s * sketch.adjoint(&r)).sum(Kind::Double));
            assert!((left - right).abs() < 1e-9, "{rows:?}: {left} vs {right}");
            assert!(max_abs(&sketch.apply(&sketch.adjoint(&r)), &r) < 1e-10);
            let a = Tensor::randn([n], (Kind::Double, Device::Cpu));
            assert_eq!(max_abs(&sketch.unshuffle(&sketch.shuffle(&a)), &a), 0.0);
        }
        // Without a seed nothing is shuffled: chunk 0 is the update's first 200 entries.
        let plain = ChunkedDct::new(n, 0.2, 3, None, DctRows::First, Device::Cpu).unwrap();
        let a = Tensor::randn([n], (Kind::Double, Device::Cpu));
        assert!(crate::host::equal(
            &plain.shuffle(&a).get(0),
            &a.narrow(0, 0, 200)
        ));
    }
}
