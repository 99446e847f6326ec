//! A `Message` as bytes and back: the format a worker sends. The upstream bits a run
//! reports are 8 x the length of these bytes, measured, not computed beside them.
//!
//! Layout, version 2, little-endian, every section starting on a byte:
//!
//! ```text
//! message  = "DPCM" version:u8 flag_count:u32 flags:bits[flag_count] payload_count:u32 payload*
//! payload  = kind:u8 dtype:u8 ndim:u8 dims:u32[ndim] body
//!   dense  (kind 0): value_bits:u8 values:bits[value_bits][numel]
//!   sparse (kind 1): value_bits:u8 index_bits:u8 k:u32 indices:bits[index_bits][k]
//!                    values:bits[value_bits][k]
//!   low rank (kind 2): rank:u32 rows:u32 cols:u32 p:f[rows*rank] q:f[cols*rank]
//!   quantised (kind 3): code:u8 magnitude_bits:u8 levels:u32 bucket:u32 scale_count:u32
//!                    scales:f32[scale_count] codes
//!     codes = sign (code 0): bits[1][numel], 1 for +1
//!           | sign-magnitude (code 1): bits[1 + magnitude_bits][numel], sign in the low bit
//!           | Elias gamma (code 2): nonzero:u32 then QSGD's Code_s (`elias`)
//!   cast   (kind 4): value_bits:u8 values:bits[value_bits][numel]
//! dtype    = 0 f32 | 1 f64 | 2 f16
//! ```
//!
//! Version 2 added kinds 3 and 4 and dtype 2; a reader of version 2 reads version-1 messages,
//! which have none of them. A threshold-v payload (`Payload::Masked`) is written as kind 1 from
//! its nonzero elements, so it reads back as `Payload::Sparse` and decodes to the same tensor.
//!
//! A value is the top `value_bits` bits of its IEEE bit pattern: exact for what DGC's low-order
//! bit removal leaves (`encoding::truncate_mantissa` zeroes the rest), so decoding gives back the
//! message's tensors bit for bit. Bit fields are packed least-significant bit first; whole-byte
//! widths (32-bit values, 32-bit indices) are copied as they are. Low-rank factors are sent at
//! full width. Flags are one bit each. The header is the fixed cost per message
//! (`HEADER_BYTES` + `PAYLOAD_HEADER_BYTES` + 4 per dimension, per payload).

use super::elias;
use super::message::{LevelCode, Message, Payload};
use crate::error::{Error, Result};
use crate::host;
use tch::{Device, Kind, Tensor};

/// The four bytes every message starts with.
pub(crate) const MAGIC: &[u8; 4] = b"DPCM";
/// The layout's version, after the magic; a reader refuses any other.
pub(crate) const VERSION: u8 = 2;
/// The oldest version a reader still reads.
pub(crate) const OLDEST_VERSION: u8 = 1;
/// Magic, version, flag count, payload count.
pub const HEADER_BYTES: usize = 4 + 1 + 4 + 4;
/// Kind, dtype, number of dimensions (the dimensions and the body's own fields come after).
pub const PAYLOAD_HEADER_BYTES: usize = 3;

pub(crate) const DENSE: u8 = 0;
pub(crate) const SPARSE: u8 = 1;
pub(crate) const LOW_RANK: u8 = 2;
pub(crate) const QUANTIZED: u8 = 3;
pub(crate) const CAST: u8 = 4;

pub(crate) const CODE_SIGN: u8 = 0;
pub(crate) const CODE_SIGN_MAGNITUDE: u8 = 1;
pub(crate) const CODE_ELIAS: u8 = 2;

pub(crate) fn bad(message: impl Into<String>) -> Error {
    Error::bad_value("message bytes", message.into())
}

/// Appends bit fields least-significant bit first.
struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    filled: u32,
}

impl<'a> BitWriter<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        BitWriter {
            out,
            acc: 0,
            filled: 0,
        }
    }

    /// The low `width` (<= 32) bits of `value`.
    fn put(&mut self, value: u64, width: u32) {
        debug_assert!(width <= 32);
        self.acc |= (value & ((1u64 << width) - 1)) << self.filled;
        self.filled += width;
        while self.filled >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.filled -= 8;
        }
    }

    /// Pads the last byte with zeros.
    fn finish(self) {
        if self.filled > 0 {
            self.out.push(self.acc as u8);
        }
    }
}

pub(crate) struct Reader<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(bad(format!(
                "{} bytes end at {} while reading {what} ({n} bytes needed)",
                self.bytes.len(),
                self.at
            )));
        };
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }
    pub(crate) fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    pub(crate) fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// `count` fields of `width` bits, packed LSB first, padded to a byte.
    fn bits(&mut self, count: usize, width: u32, what: &str) -> Result<Vec<u64>> {
        let total = count
            .checked_mul(width as usize)
            .ok_or_else(|| bad(format!("{what}: {count} fields of {width} bits overflow")))?;
        let bytes = self.take(total.div_ceil(8), what)?;
        let mut out = Vec::with_capacity(count);
        let (mut acc, mut filled, mut next) = (0u64, 0u32, 0usize);
        let mask = (1u64 << width) - 1;
        for _ in 0..count {
            while filled < width {
                acc |= (bytes[next] as u64) << filled;
                next += 1;
                filled += 8;
            }
            out.push(acc & mask);
            acc >>= width;
            filled -= width;
        }
        Ok(out)
    }
}

pub(crate) fn dtype_code(kind: Kind) -> Result<u8> {
    match kind {
        Kind::Float => Ok(0),
        Kind::Double => Ok(1),
        Kind::Half => Ok(2),
        other => Err(bad(format!(
            "payload values of kind {other:?}: expected f32, f64 or f16"
        ))),
    }
}

/// Values as their IEEE bit patterns (u32 for f32, u64 for f64), on the host.
fn bit_patterns(values: &Tensor) -> Result<Vec<u64>> {
    let flat = values.reshape([-1]).to_device(Device::Cpu);
    Ok(match values.kind() {
        Kind::Float => host::to_vec_f32(&flat)
            .map_err(|e| bad(e.to_string()))?
            .into_iter()
            .map(|v| v.to_bits() as u64)
            .collect(),
        Kind::Double => host::to_vec_f64(&flat)
            .map_err(|e| bad(e.to_string()))?
            .into_iter()
            .map(f64::to_bits)
            .collect(),
        other => return Err(bad(format!("values of kind {other:?}"))),
    })
}

/// The top `value_bits` bits of each value (all 64 of an f64).
fn put_values(out: &mut Vec<u8>, values: &Tensor, value_bits: u32) -> Result<()> {
    if values.kind() == Kind::Half {
        let patterns = host::to_vec_i64(
            &values
                .reshape([-1])
                .to_device(Device::Cpu)
                .view_dtype(Kind::Int16)
                .to_kind(Kind::Int64),
        )
        .map_err(|e| bad(e.to_string()))?;
        for bits in patterns {
            out.extend_from_slice(&(bits as u16).to_le_bytes());
        }
        return Ok(());
    }
    if values.kind() == Kind::Double {
        for bits in bit_patterns(values)? {
            out.extend_from_slice(&bits.to_le_bytes());
        }
        return Ok(());
    }
    let patterns = bit_patterns(values)?;
    if value_bits == 32 {
        for bits in patterns {
            out.extend_from_slice(&(bits as u32).to_le_bytes());
        }
        return Ok(());
    }
    let shift = 32 - value_bits;
    let mut w = BitWriter::new(out);
    for bits in patterns {
        debug_assert_eq!(
            bits & ((1 << shift) - 1),
            0,
            "value_bits {value_bits}: low bits must be zero"
        );
        w.put(bits >> shift, value_bits);
    }
    w.finish();
    Ok(())
}

fn get_values(
    r: &mut Reader,
    count: usize,
    value_bits: u32,
    dtype: u8,
    device: Device,
) -> Result<Tensor> {
    let values = match dtype {
        2 => {
            let bytes = r.take(count * 2, "f16 values")?;
            let v: Vec<i16> = bytes
                .chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]]))
                .collect();
            Tensor::from_slice(&v).view_dtype(Kind::Half)
        }
        1 => {
            let bytes = r.take(count * 8, "f64 values")?;
            let v: Vec<f64> = bytes
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
            Tensor::from_slice(&v)
        }
        0 => {
            if !(9..=32).contains(&value_bits) {
                return Err(bad(format!("value_bits {value_bits}: expected 9..=32")));
            }
            let shift = 32 - value_bits;
            let v: Vec<f32> = r
                .bits(count, value_bits, "values")?
                .into_iter()
                .map(|b| f32::from_bits((b as u32) << shift))
                .collect();
            Tensor::from_slice(&v)
        }
        other => {
            return Err(bad(format!(
                "dtype {other}: expected 0 (f32), 1 (f64) or 2 (f16)"
            )))
        }
    };
    Ok(host::upload(&values, device))
}

pub(crate) fn put_shape(out: &mut Vec<u8>, kind: u8, dtype: u8, shape: &[i64]) -> Result<()> {
    let ndim = u8::try_from(shape.len()).map_err(|_| bad("more than 255 dimensions"))?;
    out.extend_from_slice(&[kind, dtype, ndim]);
    for &d in shape {
        let d = u32::try_from(d).map_err(|_| bad(format!("dimension {d} outside u32")))?;
        out.extend_from_slice(&d.to_le_bytes());
    }
    Ok(())
}

pub(crate) fn put_u32(out: &mut Vec<u8>, value: usize, what: &str) -> Result<()> {
    let v = u32::try_from(value).map_err(|_| bad(format!("{what} {value} outside u32")))?;
    out.extend_from_slice(&v.to_le_bytes());
    Ok(())
}

/// The kept count (u32) and the flat positions at `index_bits` each.
fn put_indices(out: &mut Vec<u8>, indices: &Tensor, index_bits: u32) -> Result<()> {
    put_u32(out, indices.numel(), "kept elements")?;
    let positions = host::to_vec_i64(&indices.reshape([-1]).to_device(Device::Cpu))
        .map_err(|e| bad(e.to_string()))?;
    if index_bits == 32 {
        for p in positions {
            out.extend_from_slice(&(p as u32).to_le_bytes());
        }
    } else {
        let mut w = BitWriter::new(out);
        for p in positions {
            debug_assert!((p as u64) < (1u64 << index_bits));
            w.put(p as u64, index_bits);
        }
        w.finish();
    }
    Ok(())
}

/// The length `encode` gives. A data-dependent size (threshold-v, Elias gamma) is read from
/// the device (one counted host read); `encoded_len_split` leaves it there.
pub fn encoded_len(message: &Message) -> usize {
    let (fixed, pending) = encoded_len_split(message);
    fixed + pending.map_or(0, |t| host::i64_scalar(&t) as usize)
}

/// The length `encode` gives, as the bytes the payloads' shapes and widths fix and the rest, a
/// 0-d int64 tensor of bytes on the device when a payload's size depends on its values
/// (`Payload::pending_bits`). No copy and no device read: what a training step records.
pub fn encoded_len_split(message: &Message) -> (usize, Option<Tensor>) {
    let value_bytes = |n: usize, kind: Kind, bits: u32| match kind {
        Kind::Double => 8 * n,
        Kind::Half => 2 * n,
        _ => (n * bits as usize).div_ceil(8),
    };
    let mut pending: Option<Tensor> = None;
    let mut add = |t: Tensor| {
        pending = Some(match pending.take() {
            None => t,
            Some(total) => total + t,
        });
    };
    let bytes_of = |bits: Tensor| (bits + 7).floor_divide_scalar(8);
    let payloads: usize = message
        .payloads
        .iter()
        .map(|p| match p {
            Payload::Dense { values, value_bits } | Payload::Cast { values, value_bits } => {
                PAYLOAD_HEADER_BYTES
                    + 4 * values.dim()
                    + 1
                    + value_bytes(values.numel(), values.kind(), *value_bits)
            }
            Payload::Sparse {
                indices,
                values,
                shape,
                value_bits,
                index_bits,
            } => {
                let k = indices.numel();
                PAYLOAD_HEADER_BYTES
                    + 4 * shape.len()
                    + 2
                    + 4
                    + (k * *index_bits as usize).div_ceil(8)
                    + value_bytes(k, values.kind(), *value_bits)
            }
            Payload::Masked {
                values,
                value_bits,
                index_bits,
            } => {
                let k = values.ne(0.0).sum(Kind::Int64);
                add(bytes_of(&k * *index_bits as i64) + bytes_of(k * *value_bits as i64));
                PAYLOAD_HEADER_BYTES + 4 * values.dim() + 2 + 4
            }
            Payload::LowRank { p, q, shape } => {
                PAYLOAD_HEADER_BYTES
                    + 4 * shape.len()
                    + 12
                    + value_bytes(p.numel(), p.kind(), 32)
                    + value_bytes(q.numel(), q.kind(), 32)
            }
            Payload::Quantized {
                codes,
                scales,
                code,
                shape,
                ..
            } => {
                let head = PAYLOAD_HEADER_BYTES + 4 * shape.len() + 2 + 12 + 4 * scales.numel();
                let numel = codes.numel();
                head + match code {
                    LevelCode::Sign => numel.div_ceil(8),
                    LevelCode::SignMagnitude { magnitude_bits } => {
                        (numel * (1 + *magnitude_bits as usize)).div_ceil(8)
                    }
                    LevelCode::EliasGamma => {
                        add(bytes_of(elias::code_bits(codes)));
                        4
                    }
                }
            }
        })
        .sum();
    (
        HEADER_BYTES + message.flags.len().div_ceil(8) + payloads,
        pending,
    )
}

/// The message as version-2 bytes (this copies the payloads to the host).
pub fn encode(message: &Message) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    put_u32(&mut out, message.flags.len(), "flag count")?;
    let mut w = BitWriter::new(&mut out);
    for flag in &message.flags {
        w.put(host::i64_scalar(flag) as u64 & 1, 1);
    }
    w.finish();
    put_u32(&mut out, message.payloads.len(), "payload count")?;
    for payload in &message.payloads {
        match payload {
            Payload::Dense { values, value_bits } => {
                put_shape(&mut out, DENSE, dtype_code(values.kind())?, &values.size())?;
                out.push(*value_bits as u8);
                put_values(&mut out, values, *value_bits)?;
            }
            Payload::Sparse {
                indices,
                values,
                shape,
                value_bits,
                index_bits,
            } => {
                put_shape(&mut out, SPARSE, dtype_code(values.kind())?, shape)?;
                out.extend_from_slice(&[*value_bits as u8, *index_bits as u8]);
                put_indices(&mut out, indices, *index_bits)?;
                put_values(&mut out, values, *value_bits)?;
            }
            Payload::Cast { values, value_bits } => {
                put_shape(&mut out, CAST, dtype_code(values.kind())?, &values.size())?;
                out.push(*value_bits as u8);
                put_values(&mut out, values, *value_bits)?;
            }
            Payload::Masked {
                values,
                value_bits,
                index_bits,
            } => {
                // The nonzero elements as a sparse payload (kind 1), found on the host.
                let flat = values.reshape([-1]).to_device(Device::Cpu);
                let indices = host::nonzero(&flat).reshape([-1]);
                put_shape(&mut out, SPARSE, dtype_code(values.kind())?, &values.size())?;
                out.extend_from_slice(&[*value_bits as u8, *index_bits as u8]);
                put_indices(&mut out, &indices, *index_bits)?;
                put_values(&mut out, &flat.index_select(0, &indices), *value_bits)?;
            }
            Payload::Quantized {
                codes,
                scales,
                bucket,
                levels,
                code,
                shape,
            } => {
                put_shape(&mut out, QUANTIZED, 0, shape)?;
                let (code_kind, magnitude_bits) = match code {
                    LevelCode::Sign => (CODE_SIGN, 0),
                    LevelCode::SignMagnitude { magnitude_bits } => {
                        (CODE_SIGN_MAGNITUDE, *magnitude_bits)
                    }
                    LevelCode::EliasGamma => (CODE_ELIAS, 0),
                };
                out.extend_from_slice(&[code_kind, magnitude_bits as u8]);
                put_u32(&mut out, *levels as usize, "levels")?;
                put_u32(&mut out, *bucket as usize, "bucket")?;
                put_u32(&mut out, scales.numel(), "scale count")?;
                put_values(&mut out, &scales.to_kind(Kind::Float), 32)?;
                let codes = host::to_vec_i64(
                    &codes
                        .reshape([-1])
                        .to_device(Device::Cpu)
                        .to_kind(Kind::Int64),
                )
                .map_err(|e| bad(e.to_string()))?;
                match code {
                    LevelCode::Sign => {
                        let mut w = BitWriter::new(&mut out);
                        for c in codes {
                            w.put((c > 0) as u64, 1);
                        }
                        w.finish();
                    }
                    LevelCode::SignMagnitude { magnitude_bits } => {
                        let mut w = BitWriter::new(&mut out);
                        for c in codes {
                            let field = (c < 0) as u64 | (c.unsigned_abs() << 1);
                            debug_assert!(c.unsigned_abs() < (1 << magnitude_bits));
                            w.put(field, 1 + magnitude_bits);
                        }
                        w.finish();
                    }
                    LevelCode::EliasGamma => {
                        let nonzero = codes.iter().filter(|&&c| c != 0).count();
                        put_u32(&mut out, nonzero, "nonzero codes")?;
                        elias::write(&mut out, &codes);
                    }
                }
            }
            Payload::LowRank { p, q, shape } => {
                put_shape(&mut out, LOW_RANK, dtype_code(p.kind())?, shape)?;
                let (rows, rank) = (p.size()[0] as usize, p.size()[1] as usize);
                put_u32(&mut out, rank, "rank")?;
                put_u32(&mut out, rows, "rows")?;
                put_u32(&mut out, q.size()[0] as usize, "cols")?;
                put_values(&mut out, p, 32)?;
                put_values(&mut out, q, 32)?;
            }
        }
    }
    Ok(out)
}

/// The message from `encode`'s bytes, its tensors on `device` (on an accelerator through
/// non-blocking copies from pinned memory, `host::upload`). Errors say which field of which
/// payload was wrong.
pub fn decode(bytes: &[u8], device: Device) -> Result<Message> {
    let mut r = Reader { bytes, at: 0 };
    let magic = r.take(4, "magic")?;
    if magic != MAGIC {
        return Err(bad(format!("magic {magic:?}: expected {MAGIC:?}")));
    }
    let version = r.u8("version")?;
    if !(OLDEST_VERSION..=VERSION).contains(&version) {
        return Err(bad(format!(
            "version {version}: this build reads versions {OLDEST_VERSION} to {VERSION}"
        )));
    }
    let flag_count = r.u32("flag count")? as usize;
    let flags = r
        .bits(flag_count, 1, "flags")?
        .into_iter()
        .map(|b| host::upload(&Tensor::from(b == 1), device))
        .collect();
    let payload_count = r.u32("payload count")? as usize;
    let mut payloads = Vec::with_capacity(payload_count.min(1 << 16));
    for i in 0..payload_count {
        let kind = r.u8("payload kind")?;
        let dtype = r.u8("payload dtype")?;
        let ndim = r.u8("payload ndim")? as usize;
        let shape = (0..ndim)
            .map(|_| r.u32("dimension").map(|d| d as i64))
            .collect::<Result<Vec<i64>>>()?;
        let numel: i64 = shape.iter().product();
        let named = |e: Error| bad(format!("payload {i}: {e}"));
        payloads.push(match kind {
            DENSE => {
                let value_bits = r.u8("value bits")? as u32;
                let values =
                    get_values(&mut r, numel as usize, value_bits, dtype, device).map_err(named)?;
                Payload::Dense {
                    values: values.view(shape.as_slice()),
                    value_bits,
                }
            }
            SPARSE => {
                let value_bits = r.u8("value bits")? as u32;
                let index_bits = r.u8("index bits")? as u32;
                if !(1..=32).contains(&index_bits) {
                    return Err(bad(format!(
                        "payload {i}: index bits {index_bits}: expected 1..=32"
                    )));
                }
                let k = r.u32("kept elements")? as usize;
                let positions: Vec<i64> = r
                    .bits(k, index_bits, "indices")?
                    .into_iter()
                    .map(|p| p as i64)
                    .collect();
                if let Some(&p) = positions.iter().find(|&&p| p >= numel) {
                    return Err(bad(format!(
                        "payload {i}: index {p} outside a tensor of {numel} elements"
                    )));
                }
                let values = get_values(&mut r, k, value_bits, dtype, device).map_err(named)?;
                Payload::Sparse {
                    indices: host::upload(&Tensor::from_slice(&positions), device),
                    values,
                    shape,
                    value_bits,
                    index_bits,
                }
            }
            LOW_RANK => {
                let rank = r.u32("rank")? as i64;
                let rows = r.u32("rows")? as i64;
                let cols = r.u32("cols")? as i64;
                let p =
                    get_values(&mut r, (rows * rank) as usize, 32, dtype, device).map_err(named)?;
                let q =
                    get_values(&mut r, (cols * rank) as usize, 32, dtype, device).map_err(named)?;
                Payload::LowRank {
                    p: p.view([rows, rank]),
                    q: q.view([cols, rank]),
                    shape,
                }
            }
            CAST if version >= 2 => {
                let value_bits = r.u8("value bits")? as u32;
                let values =
                    get_values(&mut r, numel as usize, value_bits, dtype, device).map_err(named)?;
                Payload::Cast {
                    values: values.view(shape.as_slice()),
                    value_bits,
                }
            }
            QUANTIZED if version >= 2 => get_quantized(&mut r, shape, device).map_err(named)?,
            other => {
                return Err(bad(format!(
                    "payload {i}: kind {other}: expected 0 (dense), 1 (sparse), 2 (low rank), 3 (quantised) or 4 (cast) in version {version}"
                )))
            }
        });
    }
    if r.at != bytes.len() {
        return Err(bad(format!(
            "{} bytes left after the last payload",
            bytes.len() - r.at
        )));
    }
    Ok(Message { payloads, flags })
}

/// A quantised payload's body (kind 3) for a tensor of `shape`.
fn get_quantized(r: &mut Reader, shape: Vec<i64>, device: Device) -> Result<Payload> {
    let numel = shape.iter().product::<i64>() as usize;
    let code_kind = r.u8("code")?;
    let magnitude_bits = r.u8("magnitude bits")? as u32;
    let levels = r.u32("levels")?;
    let bucket = r.u32("bucket")? as i64;
    let scale_count = r.u32("scale count")? as usize;
    if levels == 0 {
        return Err(bad("levels 0: expected at least 1"));
    }
    if scale_count > 0 && (bucket < 1 || scale_count != numel.div_ceil(bucket as usize)) {
        return Err(bad(format!(
            "{scale_count} scales for {numel} elements in buckets of {bucket}: expected ceil(numel / bucket)"
        )));
    }
    let scales = get_values(r, scale_count, 32, 0, device)?;
    let (codes, code) = match code_kind {
        CODE_SIGN => (
            r.bits(numel, 1, "signs")?
                .into_iter()
                .map(|b| if b == 1 { 1 } else { -1 })
                .collect::<Vec<i32>>(),
            LevelCode::Sign,
        ),
        CODE_SIGN_MAGNITUDE => {
            if !(1..=31).contains(&magnitude_bits) {
                return Err(bad(format!(
                    "magnitude bits {magnitude_bits}: expected 1..=31"
                )));
            }
            (
                r.bits(numel, 1 + magnitude_bits, "codes")?
                    .into_iter()
                    .map(|f| {
                        let magnitude = (f >> 1) as i32;
                        if f & 1 == 1 {
                            -magnitude
                        } else {
                            magnitude
                        }
                    })
                    .collect(),
                LevelCode::SignMagnitude { magnitude_bits },
            )
        }
        CODE_ELIAS => {
            let nonzero = r.u32("nonzero codes")? as usize;
            if nonzero > numel {
                return Err(bad(format!(
                    "{nonzero} nonzero codes in a tensor of {numel} elements"
                )));
            }
            let (codes, used) = elias::read(&r.bytes[r.at..], nonzero, numel)?;
            r.take(used, "Elias-gamma codes")?;
            let codes = codes
                .into_iter()
                .map(|c| i32::try_from(c).map_err(|_| bad(format!("level {c} outside i32"))))
                .collect::<Result<Vec<i32>>>()?;
            (codes, LevelCode::EliasGamma)
        }
        other => {
            return Err(bad(format!(
                "code {other}: expected 0 (sign), 1 (sign-magnitude) or 2 (Elias gamma)"
            )))
        }
    };
    Ok(Payload::Quantized {
        codes: host::upload(&Tensor::from_slice(&codes), device),
        scales,
        bucket,
        levels,
        code,
        shape,
    })
}

/// A message's bytes are this file's format; the methods sit here so that `message` (the
/// in-memory form) does not depend on its encoding.
impl Message {
    /// The message as bytes (version 2 of this file's format).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        encode(self)
    }

    /// A message from `to_bytes`' bytes, its tensors on `device`.
    pub fn from_bytes(bytes: &[u8], device: tch::Device) -> Result<Message> {
        decode(bytes, device)
    }
}
