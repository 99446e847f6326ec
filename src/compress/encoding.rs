//! Widths and budgets of the sparse encodings (DGC, Denoise).

use tch::{Kind, Tensor};

/// How indices of kept elements are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexBits {
    /// 32-bit integers (the paper's COO count).
    Fixed32,
    /// The smallest width that addresses every element of the tensor: ceil(log2(numel)).
    Minimal,
}

impl IndexBits {
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

/// How many elements a sparse message of one `numel`-element tensor keeps so that it is `rate`
/// times smaller than the same tensor in dense fp32: the largest k with
/// k (value_bits + index_bits) <= 32 numel / rate, at least 1.
pub fn sparse_budget(numel: i64, rate: f64, value_bits: u32, index_bits: u32) -> i64 {
    let per_element = (value_bits + index_bits) as f64;
    let k = (32.0 * numel as f64 / (rate * per_element)).floor() as i64;
    k.clamp(1, numel)
}

/// Whether k kept elements in COO cost fewer bits than all `numel` values dense at `value_bits`.
pub fn sparse_is_cheaper(k: i64, numel: i64, value_bits: u32, index_bits: u32) -> bool {
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
