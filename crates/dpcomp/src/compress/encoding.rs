//! Widths and budgets of the sparse encodings (DGC, Denoise).

use tch::{Kind, Tensor};

/// How indices of kept elements are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IndexBits {
    /// 32-bit integers (the paper's COO count).
    #[default]
    Fixed32,
    /// The smallest width that addresses every element of the tensor: ceil(log2(numel)).
    Minimal,
}

impl IndexBits {
    /// Bits per index for a tensor of `numel` elements: 32, or ceil(log2(numel)) (at least 1).
    pub fn width(self, numel: i64) -> u32 {
        match self {
            IndexBits::Fixed32 => 32,
            IndexBits::Minimal => min_index_bits(numel),
        }
    }
}

/// ceil(log2(numel)), at least 1: the bits that index `numel` positions.
pub fn min_index_bits(numel: i64) -> u32 {
    let n = numel.max(2) as u64;
    64 - (n - 1).leading_zeros()
}

/// What a sparsifier's `rate` divides (`budget=bits|elements`).
///
/// The paper ("we configure the DGC algorithm to compression rates of 1, 16, and 256") does not
/// say which; its figures pin it only loosely. Its uncompressed CIFAR-10 group is 105.25 "Gb"
/// (361,290 elements x 64 bits x 39,100 steps / 8 / 2^30) and its most compressed one 1.22
/// (1.23 in the Denoise section): 86x fewer elements. Counted with `dpcomp grid
/// experiments/cifar10_dgc.toml --profile full --list` (figures in the README):
/// - `bits` (k such that the message's exact wire bits are `rate` times fewer than dense fp32;
///   at 32-bit values and indices 1/(2 rate) of the elements): 0.21 at rate 256;
/// - `elements` (k = ceil(numel / rate), the DGC reference's `compress_ratio`): 0.41;
/// - `elements` with 1-D tensors sent dense (`dense_vectors=true`): 0.70;
/// - with DGC's exponential warm-up (`warmup_epochs=4`, density 1/4, 1/16, 1/64, then 1/256): 0.75,
///   and 1.03 with 1-D tensors dense; with the reference's geometric warm-up
///   (`warmup=reference`, density rate^-(e+1)/(W+1)) over 5 epochs 1.08, and 1.37 with 1-D dense.
///
/// None gives 86x exactly. The experiment files use `elements` (DGC's own meaning of the rate,
/// and the one under which the paper's unit shrinks by the rate); the library's default stays
/// `bits` (a rate that is exact on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Budget {
    /// k such that k (value_bits + index_bits) <= 32 numel / rate.
    #[default]
    Bits,
    /// k = ceil(numel / rate).
    Elements,
}

/// How many elements a sparse message of one `numel`-element tensor keeps at `rate`, at least 1:
/// under `Budget::Bits` the largest k with k (value_bits + index_bits) <= 32 numel / rate (so the
/// message is `rate` times smaller than the tensor in dense fp32); under `Budget::Elements`
/// ceil(numel / rate).
pub fn sparse_budget(
    numel: i64,
    rate: f64,
    value_bits: u32,
    index_bits: u32,
    budget: Budget,
) -> i64 {
    let k = match budget {
        Budget::Bits => {
            let per_element = (value_bits + index_bits) as f64;
            (32.0 * numel as f64 / (rate * per_element)).floor() as i64
        }
        Budget::Elements => (numel as f64 / rate).ceil() as i64,
    };
    k.clamp(1, numel)
}

/// Whether k kept elements in COO cost fewer bits than all `numel` values dense at `value_bits`.
pub(crate) fn sparse_is_cheaper(k: i64, numel: i64, value_bits: u32, index_bits: u32) -> bool {
    (k as u64) * ((value_bits + index_bits) as u64) < (numel as u64) * (value_bits as u64)
}

/// A new tensor: fp32 values with their low-order mantissa bits zeroed so that `value_bits` bits remain
/// (1 sign + 8 exponent + value_bits - 9 mantissa bits; 32 leaves the values unchanged, 16 is
/// bfloat16's layout). Truncation toward zero, as the receiver reads the removed bits as zeros
/// (the paper's "removing the low-order bits in their floating point representation").
pub fn truncate_mantissa(values: &Tensor, value_bits: u32) -> Tensor {
    assert!(
        (9..=32).contains(&value_bits),
        "value_bits {value_bits} outside 9..=32"
    );
    if value_bits == 32 {
        return values.to_kind(Kind::Float).copy();
    }
    let mask = (u32::MAX << (32 - value_bits)) as i32;
    values
        .to_kind(Kind::Float)
        .view_dtype(Kind::Int)
        .bitwise_and(mask as i64)
        .view_dtype(Kind::Float)
}
