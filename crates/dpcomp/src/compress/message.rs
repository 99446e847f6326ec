//! What goes on the wire, and exactly how many bits it takes.
//!
//! Encodings (the paper counts upstream bandwidth per client, sparse tensors in COO format):
//! - dense: every value at `value_bits` (32 for fp32; fewer after DGC's low-order-bit removal);
//! - sparse COO: per kept element one value (`value_bits`) and one index (`index_bits`: 32, or the
//!   smallest width that addresses the tensor, `encoding::min_index_bits`);
//! - low rank (PowerSGD): the factors P [n, r] and Q [m, r] in fp32, 32 (n + m) r bits;
//! - quantised (QSGD, TernGrad, signSGD, EF-signSGD, int8): an integer code per element and one
//!   fp32 scale per bucket, each code at a fixed width (sign bit + magnitude bits, or the sign
//!   alone) or in QSGD's Elias-gamma code (`LevelCode`);
//! - masked (threshold-v): the sparse COO encoding of a tensor's nonzero elements, held on the
//!   device as the dense tensor with zeros where nothing is sent, so that choosing them never
//!   waits for the device (the count is data-dependent: `Payload::pending_bits`);
//!
//! plus one bit per flag (Denoise's velocity/acceleration bit).
//!
//! Beside the exact wire bits every message also reports **the paper's unit**
//! (`paper_bits`): 64 bits per transmitted element, dense or sparse alike (a 32-bit value and a
//! 32-bit index, the COO count of its "upstream bandwidth" paragraph), plus the flag bits. Its
//! figures are that count / 8 / 2^30 and labelled "Gb": 361,290 CIFAR-10 parameters x 64 bits
//! x 39,100 steps / 8 / 2^30 = 105.25, the paper's uncompressed CIFAR-10 group "105.25Gb", and
//! 118,034 Surnames parameters x 64 x 50,200 steps gives 44.15 against its 44.22.
//!
//! The paper counts no quantiser. A quantised or cast payload is counted at twice its wire bits
//! there (a dense fp32 element is 32 wire bits and 64 of the paper's): each compressor's size
//! relative to the uncompressed run is then the same in both units.
//!
//! Two encodings have a length that depends on the values (threshold-v's kept count and QSGD's
//! Elias-gamma code). Their sizes stay on the device as tensors (`Payload::pending_bits`) until
//! the trainer reads them, at its logging intervals and at the epoch's end, all the steps'
//! sizes in one read; `wire_bits`, `elements` and `paper_bits` read them at once (one counted
//! host read, `crate::host`).

use crate::host;
use tch::{Kind, Tensor};

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
    /// Integer codes with per-bucket scales: element i is `scales[i / bucket] * codes[i] /
    /// levels` (scale 1 when `scales` is empty).
    Quantized {
        /// One integer code per element (int8 or int32 on the device), flat in row-major order.
        codes: Tensor,
        /// fp32 scales, one per `bucket` consecutive elements (\[ceil(numel / bucket)\]), or
        /// empty (\[0\]) for codes that carry no scale (signSGD's signs).
        scales: Tensor,
        /// Elements per scale (numel: one scale for the tensor).
        bucket: i64,
        /// The divisor s of the codes (QSGD's levels; 1 for the others).
        levels: u32,
        /// How each code is written.
        code: LevelCode,
        /// The parameter's shape.
        shape: Vec<i64>,
    },
    /// Every value in a narrower floating-point format: fp16 (`values` of kind Half, 16 bits),
    /// bfloat16 (fp32 values whose low 16 bits are zero, `value_bits` 16) or natural
    /// compression's signed powers of two (fp32 with no mantissa, `value_bits` 9: sign and
    /// exponent).
    Cast {
        /// The values in the parameter's shape.
        values: Tensor,
        /// Bits sent per value.
        value_bits: u32,
    },
    /// A sparse COO payload held as the dense tensor with zeros where nothing is sent (threshold-v):
    /// the kept elements are the nonzero ones. Its bytes are a `Sparse` payload's.
    Masked {
        /// The sent values in the parameter's shape, zero elsewhere (fp32, already truncated).
        values: Tensor,
        /// Bits sent per value.
        value_bits: u32,
        /// Bits sent per index.
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
    /// Exact size of this payload on the wire, without the headers (for a data-dependent size,
    /// `pending_bits`, after one counted host read).
    pub fn wire_bits(&self) -> u64 {
        match self {
            Payload::Dense { values, value_bits } | Payload::Cast { values, value_bits } => {
                values.numel() as u64 * *value_bits as u64
            }
            Payload::Sparse {
                indices,
                value_bits,
                index_bits,
                ..
            } => indices.numel() as u64 * (*value_bits + *index_bits) as u64,
            Payload::LowRank { p, q, .. } => 32 * (p.numel() + q.numel()) as u64,
            Payload::Quantized { .. } | Payload::Masked { .. } => {
                self.fixed_bits()
                    + self
                        .pending_bits()
                        .map_or(0, |t| host::i64_scalar(&t) as u64)
            }
        }
    }

    /// The part of `wire_bits` known from the shapes alone.
    pub(crate) fn fixed_bits(&self) -> u64 {
        match self {
            Payload::Quantized {
                codes,
                scales,
                code,
                ..
            } => {
                32 * scales.numel() as u64
                    + match code {
                        LevelCode::Sign => codes.numel() as u64,
                        LevelCode::SignMagnitude { magnitude_bits } => {
                            codes.numel() as u64 * (1 + *magnitude_bits as u64)
                        }
                        LevelCode::EliasGamma => 0,
                    }
            }
            Payload::Masked { .. } => 0,
            _ => self.wire_bits(),
        }
    }

    /// The data-dependent part of the payload's bits, as a 0-d int64 tensor on its device
    /// (`None` when the shapes fix the size): QSGD's Elias-gamma codes, threshold-v's kept
    /// elements at `value_bits + index_bits` each. Computing it never waits for the device.
    pub fn pending_bits(&self) -> Option<Tensor> {
        match self {
            Payload::Quantized {
                codes,
                code: LevelCode::EliasGamma,
                ..
            } => Some(super::elias::code_bits(codes)),
            Payload::Masked {
                values,
                value_bits,
                index_bits,
            } => Some(kept_count(values) * (*value_bits + *index_bits) as i64),
            _ => None,
        }
    }

    /// Elements this payload transmits: every value of a dense tensor, the kept values of a
    /// sparse one, the entries of both low-rank factors, every code of a quantised one.
    pub fn elements(&self) -> u64 {
        match self {
            Payload::Dense { values, .. } | Payload::Cast { values, .. } => values.numel() as u64,
            Payload::Sparse { indices, .. } => indices.numel() as u64,
            Payload::LowRank { p, q, .. } => (p.numel() + q.numel()) as u64,
            Payload::Quantized { codes, .. } => codes.numel() as u64,
            Payload::Masked { values, .. } => host::i64_scalar(&kept_count(values)) as u64,
        }
    }

    /// This payload in the paper's unit: 64 bits per transmitted element, or twice the wire
    /// bits of a quantised or cast payload (the module's docs).
    pub fn paper_bits(&self) -> u64 {
        match self {
            Payload::Quantized { .. } | Payload::Cast { .. } => 2 * self.wire_bits(),
            _ => PAPER_BITS_PER_ELEMENT * self.elements(),
        }
    }

    /// The paper's bits known from the shapes, and the data-dependent rest as a device tensor.
    pub(crate) fn paper_bits_split(&self) -> (u64, Option<Tensor>) {
        match self {
            Payload::Quantized { .. } => {
                (2 * self.fixed_bits(), self.pending_bits().map(|t| t * 2))
            }
            Payload::Masked { values, .. } => {
                (0, Some(kept_count(values) * PAPER_BITS_PER_ELEMENT as i64))
            }
            _ => (self.paper_bits(), None),
        }
    }

    /// The same payload with every tensor replaced by `f` of it (the host staging's copies).
    pub fn map_tensors(&self, mut f: impl FnMut(&Tensor) -> Tensor) -> Payload {
        match self {
            Payload::Dense { values, value_bits } => Payload::Dense {
                values: f(values),
                value_bits: *value_bits,
            },
            Payload::Cast { values, value_bits } => Payload::Cast {
                values: f(values),
                value_bits: *value_bits,
            },
            Payload::Sparse {
                indices,
                values,
                shape,
                value_bits,
                index_bits,
            } => Payload::Sparse {
                indices: f(indices),
                values: f(values),
                shape: shape.clone(),
                value_bits: *value_bits,
                index_bits: *index_bits,
            },
            Payload::LowRank { p, q, shape } => Payload::LowRank {
                p: f(p),
                q: f(q),
                shape: shape.clone(),
            },
            Payload::Quantized {
                codes,
                scales,
                bucket,
                levels,
                code,
                shape,
            } => Payload::Quantized {
                codes: f(codes),
                scales: f(scales),
                bucket: *bucket,
                levels: *levels,
                code: *code,
                shape: shape.clone(),
            },
            Payload::Masked {
                values,
                value_bits,
                index_bits,
            } => Payload::Masked {
                values: f(values),
                value_bits: *value_bits,
                index_bits: *index_bits,
            },
        }
    }

    /// The device its tensors live on.
    pub fn device(&self) -> tch::Device {
        match self {
            Payload::Dense { values, .. }
            | Payload::Cast { values, .. }
            | Payload::Sparse { values, .. }
            | Payload::Masked { values, .. } => values.device(),
            Payload::LowRank { p, .. } => p.device(),
            Payload::Quantized { codes, .. } => codes.device(),
        }
    }

    /// The tensor the receiver reconstructs (fp32 for casts and codes).
    pub fn to_dense(&self) -> Tensor {
        match self {
            Payload::Dense { values, .. } => values.shallow_clone(),
            Payload::Cast { values, .. } => values.to_kind(Kind::Float),
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
            Payload::Quantized {
                codes,
                scales,
                bucket,
                levels,
                shape,
                ..
            } => {
                // 1 / levels folded into the (few) scales; the codes scaled in place.
                let mut values = codes.to_kind(Kind::Float);
                if *levels == 1 {
                    scale_buckets(values, scales, *bucket).view(shape.as_slice())
                } else if scales.numel() == 0 {
                    values.g_div_scalar_(*levels as f64).view(shape.as_slice())
                } else {
                    let scales = scales / *levels as f64;
                    scale_buckets(values, &scales, *bucket).view(shape.as_slice())
                }
            }
            Payload::Masked { values, .. } => values.shallow_clone(),
        }
    }
}

/// The nonzero elements of `values`, a 0-d int64 tensor on its device (no host read).
fn kept_count(values: &Tensor) -> Tensor {
    values.ne(0.0).sum(Kind::Int64)
}

/// `values` (flat \[numel\], a tensor of its own) times the scale of each one's bucket,
/// `scales[i / bucket]`, in place; unchanged when `scales` is empty.
pub(crate) fn scale_buckets(mut values: Tensor, scales: &Tensor, bucket: i64) -> Tensor {
    let numel = values.numel() as i64;
    match scales.numel() as i64 {
        0 => values,
        1 => values.g_mul_(&scales.reshape([])),
        buckets => {
            // The whole buckets as rows, then the ragged last one.
            let whole = numel / bucket;
            if whole > 0 {
                let _ = values
                    .narrow(0, 0, whole * bucket)
                    .view([whole, bucket])
                    .g_mul_(&scales.narrow(0, 0, whole).view([-1, 1]));
            }
            if buckets > whole {
                let _ = values
                    .narrow(0, whole * bucket, numel - whole * bucket)
                    .g_mul_(&scales.narrow(0, whole, 1));
            }
            values
        }
    }
}

/// How the integer codes of a `Payload::Quantized` are written, one after another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LevelCode {
    /// One bit per code: 1 for +1, 0 for -1 (every code is ±1; signSGD).
    Sign,
    /// A sign bit (1 for negative), then |code| in `magnitude_bits` bits, per element
    /// (QSGD's fixed width ceil(log2(s + 1)), TernGrad's 1, int8's 7).
    SignMagnitude {
        /// Bits of |code|.
        magnitude_bits: u32,
    },
    /// QSGD's Code_s (Alistarh et al. 2017, section 3.2): for each nonzero code in order, the
    /// Elias-gamma code of (zeros before it + 1), its sign bit, the Elias-gamma code of |code|
    /// (the nonzero count is in the header).
    EliasGamma,
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
    /// `wire` and pad each section to a byte. A data-dependent size is read from the device.
    pub fn wire_bits(&self) -> u64 {
        self.payloads.iter().map(Payload::wire_bits).sum::<u64>() + self.flags.len() as u64
    }

    /// Whether a payload's size depends on its values (`Payload::pending_bits`).
    pub fn has_pending_size(&self) -> bool {
        self.payloads.iter().any(|p| {
            matches!(
                p,
                Payload::Masked { .. }
                    | Payload::Quantized {
                        code: LevelCode::EliasGamma,
                        ..
                    }
            )
        })
    }

    /// Elements transmitted by all payloads.
    pub fn elements(&self) -> u64 {
        self.payloads.iter().map(Payload::elements).sum()
    }

    /// The paper's count: `PAPER_BITS_PER_ELEMENT` per transmitted element (twice the wire
    /// bits of a quantised payload) plus the flag bits.
    pub fn paper_bits(&self) -> u64 {
        self.payloads.iter().map(Payload::paper_bits).sum::<u64>() + self.flags.len() as u64
    }

    /// `paper_bits` as the part known from the shapes and the data-dependent rest, a 0-d int64
    /// tensor on the device (`None` when there is none): what a training step records without
    /// waiting for the device.
    pub fn paper_bits_split(&self) -> (u64, Option<Tensor>) {
        let mut fixed = self.flags.len() as u64;
        let mut pending: Option<Tensor> = None;
        for p in &self.payloads {
            let (f, rest) = p.paper_bits_split();
            fixed += f;
            if let Some(rest) = rest {
                pending = Some(match pending {
                    None => rest,
                    Some(total) => total + rest,
                });
            }
        }
        (fixed, pending)
    }
}
