//! What goes on the wire, and exactly how many bits it takes.
//!
//! Encodings (the paper counts upstream bandwidth per client, sparse tensors in COO format):
//! - dense: every value at `value_bits` (32 for fp32; fewer after DGC's low-order-bit removal);
//! - sparse COO: per kept element one value (`value_bits`) and one index (`index_bits`: 32, or the
//!   smallest width that addresses the tensor, `encoding::min_index_bits`);
//! - low rank (PowerSGD): the factors P [n, r] and Q [m, r] in fp32, 32 (n + m) r bits;
//!
//! plus one bit per flag (Denoise's velocity/acceleration bit).
//!
//! Beside the exact wire bits every message also reports **the paper's unit**
//! (`paper_bits`): 64 bits per transmitted element, dense or sparse alike (a 32-bit value and a
//! 32-bit index, the COO count of its "upstream bandwidth" paragraph), plus the flag bits. Its
//! figures are that count / 8 / 2^30 and labelled "Gb": 361,290 CIFAR-10 parameters x 64 bits
//! x 39,100 steps / 8 / 2^30 = 105.25, the paper's uncompressed CIFAR-10 group "105.25Gb", and
//! 118,034 Surnames parameters x 64 x 50,200 steps gives 44.15 against its 44.22.

use tch::Tensor;

/// The paper's bits per transmitted element: a 32-bit value and a 32-bit index (COO).
pub const PAPER_BITS_PER_ELEMENT: u64 = 64;

/// Bits -> the paper's "Gb" (GiB: bits / 8 / 2^30).
pub fn paper_gib(bits: u64) -> f64 {
    bits as f64 / 8.0 / (1u64 << 30) as f64
}

/// One tensor's encoding. Values are stored as the receiver will read them (already truncated).
pub enum Payload {
    /// Every value of the tensor.
    Dense {
        /// The values, in the parameter's shape.
        values: Tensor,
        /// Bits sent per value (32: fp32; fewer after low-order-bit removal).
        value_bits: u32,
    },
    /// Kept elements in COO: positions and values.
    Sparse {
        /// Flat positions (int64 on the device) of the kept elements.
        indices: Tensor,
        /// The kept values \[k\], in the order of `indices`.
        values: Tensor,
        /// The parameter's shape (the receiver scatters into a zero tensor of this shape).
        shape: Vec<i64>,
        /// Bits sent per value.
        value_bits: u32,
        /// Bits sent per index (32, or the minimal width for the tensor).
        index_bits: u32,
    },
    /// PowerSGD's factors: the receiver forms P Qᵀ.
    LowRank {
        /// [rows, r], orthonormal columns.
        p: Tensor,
        /// [cols, r].
        q: Tensor,
        /// The parameter's shape; P Qᵀ flattened row-major, first numel entries.
        shape: Vec<i64>,
    },
}

impl Payload {
    /// Exact size of this payload on the wire.
    pub fn wire_bits(&self) -> u64 {
        match self {
            Payload::Dense { values, value_bits } => values.numel() as u64 * *value_bits as u64,
            Payload::Sparse {
                indices,
                value_bits,
                index_bits,
                ..
            } => indices.numel() as u64 * (*value_bits + *index_bits) as u64,
            Payload::LowRank { p, q, .. } => 32 * (p.numel() + q.numel()) as u64,
        }
    }

    /// Elements this payload transmits: every value of a dense tensor, the kept values of a
    /// sparse one, the entries of both low-rank factors.
    pub fn elements(&self) -> u64 {
        match self {
            Payload::Dense { values, .. } => values.numel() as u64,
            Payload::Sparse { indices, .. } => indices.numel() as u64,
            Payload::LowRank { p, q, .. } => (p.numel() + q.numel()) as u64,
        }
    }

    /// The tensor the receiver reconstructs.
    pub fn to_dense(&self) -> Tensor {
        match self {
            Payload::Dense { values, .. } => values.shallow_clone(),
            Payload::Sparse {
                indices,
                values,
                shape,
                ..
            } => {
                let numel: i64 = shape.iter().product();
                Tensor::zeros([numel], (values.kind(), values.device()))
                    .index_put_(&[Some(indices)], values, false)
                    .view(shape.as_slice())
            }
            Payload::LowRank { p, q, shape } => {
                let numel: i64 = shape.iter().product();
                p.mm(&q.tr())
                    .reshape([-1])
                    .narrow(0, 0, numel)
                    .view(shape.as_slice())
            }
        }
    }
}

/// One worker's message for one step: payloads (one per parameter, or one for the whole model
/// for model-wise sparsification) and one-bit flags (Denoise: one per payload, true when it
/// carries a velocity, false for an acceleration). Flags stay 0-d bool tensors on the device, so
/// choosing them needs no host synchronisation; each costs one bit.
pub struct Message {
    /// The encoded tensors, in the parameters' order (one flat payload when model-wise).
    pub payloads: Vec<Payload>,
    /// Denoise's velocity (true) / acceleration (false) bits, 0-d bool tensors; empty otherwise.
    pub flags: Vec<Tensor>,
}

impl Message {
    /// A message of `payloads` without flags.
    pub fn new(payloads: Vec<Payload>) -> Self {
        Message {
            payloads,
            flags: Vec::new(),
        }
    }

    /// Bits of the payloads and flags alone; the bytes (`to_bytes`) add the headers of
    /// `wire` and pad each section to a byte.
    pub fn wire_bits(&self) -> u64 {
        self.payloads.iter().map(Payload::wire_bits).sum::<u64>() + self.flags.len() as u64
    }

    /// Elements transmitted by all payloads.
    pub fn elements(&self) -> u64 {
        self.payloads.iter().map(Payload::elements).sum()
    }

    /// The paper's count: `PAPER_BITS_PER_ELEMENT` per transmitted element plus the flag bits.
    pub fn paper_bits(&self) -> u64 {
        PAPER_BITS_PER_ELEMENT * self.elements() + self.flags.len() as u64
    }
}
