//! The k largest-magnitude elements of a flat tensor: exactly (LibTorch's `topk`), or through a
//! threshold estimated on a random sample (DGC, Lin et al. 2018, section 3.1 / its reference
//! implementation), which on large tensors replaces a selection over every element by one
//! comparison pass and a selection over the few survivors.
//!
//! The sampled path is still exact: every element at or above the threshold is a candidate; when
//! there are at least k candidates, the k largest candidates are the k largest elements (all
//! non-candidates are smaller than every candidate). When the sample's threshold lets fewer than k
//! through, the threshold is halved up to `RETRIES` times and then the exact path runs.
//!
//! Which one runs by default depends on the device (`TopK::Auto`). The candidates'
//! number depends on the data, so the sampled path asks the host to wait for the device once per
//! selection (`host::nonzero`, counted): on the CPU that costs nothing and the sampled path is
//! the faster, so it is the CPU default; on CUDA a training step must not wait, and LibTorch's
//! `topk` (a radix selection that runs on the device with a size known in advance) is the
//! default there. Both give the k largest magnitudes (among equal ones, not necessarily the
//! same positions).

use tch::{Device, Kind, Tensor};

/// Halvings of the sampled threshold before falling back to the exact top-k.
pub(crate) const RETRIES: usize = 3;

/// How `largest` finds the k largest magnitudes; each gives the exact top-k (`topk=` option;
/// module docs for which to use where).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TopK {
    /// LibTorch's `topk` over every element (`topk=exact`): no host read and no wait for the
    /// device, what a CUDA step runs.
    Exact,
    /// Threshold from a uniform sample of `ratio` of the elements (at least 1024), then a
    /// selection among the elements above it (`topk=sampled`). Tensors under 2^15 elements, or
    /// where k is a quarter of the elements or more, use the exact selection. Faster on the CPU;
    /// the candidates' count is a data-dependent size (`host::nonzero`), which on CUDA makes
    /// the host wait for the device in every step.
    Sampled {
        /// Share of the elements sampled, in (0, 1] (`sample_ratio`, default 0.01).
        ratio: f64,
    },
    /// The default (`topk=auto`): `Sampled { ratio }` on the CPU, where it is faster, and
    /// `Exact` on any other device, where a step must not wait for the device.
    Auto {
        /// The sample's share on the CPU, in (0, 1] (`sample_ratio`, default 0.01).
        ratio: f64,
    },
}

impl TopK {
    /// The default: `Auto` with a 1% sample on the CPU.
    pub const DEFAULT: TopK = TopK::Auto { ratio: 0.01 };

    /// The selection that runs for a tensor on `device`: `Auto` resolved, the others as they
    /// are.
    pub fn on(self, device: Device) -> TopK {
        match self {
            TopK::Auto { ratio } if device == Device::Cpu => TopK::Sampled { ratio },
            TopK::Auto { .. } => TopK::Exact,
            chosen => chosen,
        }
    }
}

/// How many more sample elements than expected the threshold is set to let through.
pub(crate) const MARGIN: f64 = 1.2;

/// Smallest sample the sampled threshold uses.
pub(crate) const MIN_SAMPLE: i64 = 1024;

/// Below this size the exact selection is used regardless (sampling would not save work).
pub(crate) const SAMPLING_FROM: i64 = 1 << 15;

/// Positions (int64) and values of the k largest |x| of the flat tensor `x`, positions ascending.
pub fn largest(x: &Tensor, k: i64, mode: TopK) -> (Tensor, Tensor) {
    let n = x.numel() as i64;
    assert!(x.dim() == 1 && k >= 1 && k <= n, "largest: k {k} of {n}");
    let indices = match mode.on(x.device()) {
        TopK::Sampled { ratio } if n >= SAMPLING_FROM && k * 4 < n => {
            sampled(x, k, ratio).unwrap_or_else(|| exact(x, k).sort(0, false).0)
        }
        _ => exact(x, k).sort(0, false).0,
    };
    let values = x.index_select(0, &indices);
    (indices, values)
}

fn exact(x: &Tensor, k: i64) -> Tensor {
    if k == x.numel() as i64 {
        return Tensor::arange(k, (Kind::Int64, x.device()));
    }
    x.abs().topk(k, 0, true, false).1
}

/// The k largest |x| by the sampled threshold, positions ascending; `None` when the threshold
/// let fewer than k through `RETRIES` + 1 times. No magnitude of x's size is formed: the sample's
/// magnitudes are taken from its own values. On a host f32 vector the candidates above the
/// threshold and the k largest of them come from one pass and a linear selection
/// (`host::largest_magnitudes_at_least`); elsewhere from LibTorch's ops (`largest_candidates`).
fn sampled(x: &Tensor, k: i64, ratio: f64) -> Option<Tensor> {
    let n = x.numel() as i64;
    let samples = ((ratio * n as f64).ceil() as i64).max(MIN_SAMPLE).min(n);
    let picks = Tensor::randint(n, [samples], (Kind::Int64, x.device()));
    let sample = x.index_select(0, &picks).abs();
    // The sample's (k s / n)-th largest value estimates the k-th largest of x; asking for
    // a margin more (MARGIN times, plus three binomial standard deviations) makes a threshold at
    // or below the true k-th value, hence a single pass, the likely outcome.
    let expected = k as f64 * samples as f64 / n as f64;
    let sample_k = ((expected * MARGIN + 3.0 * expected.sqrt()).ceil() as i64).clamp(1, samples);
    let mut threshold = sample.topk(sample_k, 0, true, false).0.min();
    let on_host = crate::host::is_host_f32_vector(x);
    for _ in 0..=RETRIES {
        let chosen = if on_host {
            crate::host::largest_magnitudes_at_least(x, &threshold, k as usize)
        } else {
            largest_candidates(x, &threshold, k)
        };
        if chosen.is_some() {
            return chosen;
        }
        threshold *= 0.5;
    }
    None
}

/// The k largest |x| among the candidates at or above `threshold`, positions ascending, by
/// LibTorch's ops (any device); `None` when fewer than k reach the threshold.
fn largest_candidates(x: &Tensor, threshold: &Tensor, k: i64) -> Option<Tensor> {
    let candidates = crate::host::magnitude_at_least(x, threshold);
    if candidates.size()[0] < k {
        return None;
    }
    let best = x
        .index_select(0, &candidates)
        .abs()
        .topk(k, 0, true, false)
        .1;
    Some(chosen_ascending(&candidates, &best, k))
}

/// `candidates` (ascending) at the k distinct positions `best`, in ascending order: what
/// sorting `candidates.index_select(0, best)` gives, by marking the chosen positions and
/// placing each at its rank among them (passes over the candidates instead of a sort of k).
fn chosen_ascending(candidates: &Tensor, best: &Tensor, k: i64) -> Tensor {
    let found = candidates.size()[0];
    let device = candidates.device();
    let chosen = Tensor::zeros([found], (Kind::Bool, device)).index_fill(0, best, 1);
    let rank = chosen.cumsum(0, Kind::Int64) - 1;
    // The unchosen all go to slot k, dropped after.
    let slot = rank.where_scalarother(&chosen, k);
    Tensor::empty([k + 1], (Kind::Int64, device))
        .scatter(0, &slot, candidates)
        .narrow(0, 0, k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sampled_selection_is_the_exact_one_ascending() {
        let _serial = crate::test_serial();
        tch::manual_seed(11);
        for (n, k) in [(100_000, 1_000), (1 << 15, 8_000), (50_000, 1)] {
            let x = Tensor::randn([n], (Kind::Float, Device::Cpu));
            let (indices, values) = largest(&x, k, TopK::Sampled { ratio: 0.01 });
            let expected = exact(&x, k).sort(0, false).0;
            assert!(crate::host::equal(&indices, &expected), "n {n} k {k}");
            assert!(crate::host::equal(&values, &x.index_select(0, &expected)));
        }
    }

    #[test]
    fn the_host_selection_equals_libtorchs_and_breaks_ties_by_position() {
        let _serial = crate::test_serial();
        tch::manual_seed(12);
        // Distinct magnitudes: the same positions as `topk` over the candidates.
        let x = Tensor::randn([60_000], (Kind::Float, Device::Cpu));
        let threshold = Tensor::from(1.0f32);
        for k in [1, 500, 9_000] {
            let host = crate::host::largest_magnitudes_at_least(&x, &threshold, k as usize);
            let ops = largest_candidates(&x, &threshold, k);
            let (host, ops) = (
                host.expect("enough candidates"),
                ops.expect("enough candidates"),
            );
            assert!(crate::host::equal(&host, &ops), "k {k}");
        }
        // Fewer candidates than k: none, on both paths.
        let found = crate::host::magnitude_at_least(&x, &threshold).size()[0];
        let too_many = found as usize + 1;
        assert!(crate::host::largest_magnitudes_at_least(&x, &threshold, too_many).is_none());
        assert!(largest_candidates(&x, &threshold, too_many as i64).is_none());
        // Ties at the k-th magnitude: the larger ones, then the lowest positions of the tied.
        let x = Tensor::from_slice(&[2.0f32, -1.0, 3.0, 1.0, -1.0, 0.5, 1.0, -4.0]);
        let chosen = crate::host::largest_magnitudes_at_least(&x, &Tensor::from(0.75f32), 5)
            .expect("6 candidates");
        assert_eq!(
            crate::host::to_vec_i64(&chosen).unwrap(),
            vec![0, 1, 2, 3, 7]
        );
        let exactly = crate::host::largest_magnitudes_at_least(&x, &Tensor::from(1.5f32), 3)
            .expect("3 candidates");
        assert_eq!(crate::host::to_vec_i64(&exactly).unwrap(), vec![0, 2, 7]);
    }

    #[test]
    fn the_block_pass_finds_what_the_mask_finds() {
        let _serial = crate::test_serial();
        tch::manual_seed(13);
        // 16-value blocks and a tail, with NaN, infinities, signed zeros and values equal to
        // the threshold scattered through them.
        let x = Tensor::randn([1_003], (Kind::Float, Device::Cpu));
        let specials = [
            (3, f32::NAN),
            (17, f32::INFINITY),
            (18, f32::NEG_INFINITY),
            (40, -0.0),
            (41, 0.0),
            (64, 1.0),
            (65, -1.0),
            (1_001, -1.0),
            (1_002, f32::NAN),
        ];
        for (i, v) in specials {
            let _ = x.narrow(0, i, 1).fill_(v as f64);
        }
        for t in [0.0f32, 1.0, 2.5, f32::INFINITY] {
            let threshold = Tensor::from(t);
            let expected = crate::host::nonzero(&x.abs().ge_tensor(&threshold)).view([-1]);
            let found = crate::host::magnitude_at_least(&x, &threshold);
            assert!(crate::host::equal(&found, &expected), "threshold {t}");
        }
    }

    #[test]
    fn the_one_pass_candidates_are_nonzero_of_the_mask() {
        let x = Tensor::from_slice(&[0.5f32, -2.0, f32::NAN, 1.0, -1.0, 0.0, f32::INFINITY]);
        for t in [0.0f32, 1.0, 3.0] {
            let threshold = Tensor::from(t);
            let expected = crate::host::nonzero(&x.abs().ge_tensor(&threshold)).view([-1]);
            let found = crate::host::magnitude_at_least(&x, &threshold);
            assert!(crate::host::equal(&found, &expected), "threshold {t}");
            let double = x.to_kind(Kind::Double);
            let found = crate::host::magnitude_at_least(&double, &threshold.to_kind(Kind::Double));
            assert!(crate::host::equal(&found, &expected), "f64, threshold {t}");
        }
    }
}
