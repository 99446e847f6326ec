//! A message's bytes (`wire`'s format, byte for byte) made and read where its tensors live, so
//! that a transport moving device memory (c10d on Gloo or NCCL, `comm::Communicator::
//! moves_tensors`) sends a data-parallel step's messages without a copy to the host or a wait
//! for the device.
//!
//! The format's fields are of two sorts. Its *layout*, the magic, counts, shapes, widths and
//! the number of kept elements, follows from the tensors' shapes, which the host knows without
//! reading a value; its *data*, the values, positions, codes and flags, is packed on the device
//! by tensor operations: whole-byte fields (32-bit values and positions, f16, f64) are the
//! tensors' own bytes (little-endian, as the format), narrower ones are split into bits and
//! packed eight to a byte, least-significant bit first, as `wire`'s bit writer does. The result
//! is two things: the layout, a few bytes per payload in host memory, which the ranks exchange
//! through the transport's host collectives, and the whole message as a uint8 tensor on the
//! device, equal to `Message::to_bytes()` (tested), whose length is the bits a step reports.
//! A receiver walks the layout to find each data section in the device bytes and unpacks it
//! there.
//!
//! A message whose size depends on its values (threshold-v's kept elements, QSGD's Elias-gamma
//! codes: `Message::has_pending_size`) has no layout before the device is read; `encode`
//! refuses it and the exchange sends it through host memory, one counted read per step.
//!
//! The receiver trusts its peers' data as a process group trusts its tensors: the layout's
//! fields are checked (widths, counts, lengths), but a position is not compared with the
//! tensor's size, which would need the device's values on the host.

use super::message::{LevelCode, Message, Payload};
use super::wire::{
    bad, dtype_code, put_shape, put_u32, Reader, CAST, CODE_ELIAS, CODE_SIGN, CODE_SIGN_MAGNITUDE,
    DENSE, LOW_RANK, MAGIC, OLDEST_VERSION, QUANTIZED, SPARSE, VERSION,
};
use crate::error::Result;
use crate::host;
use tch::{Device, Kind, Tensor};

// The device's bytes of an int64 or float are the format's little-endian bytes.
#[cfg(not(target_endian = "little"))]
compile_error!("wire_on_device reads tensors' bytes as little-endian");

/// A message ready for a transport of device memory.
pub struct DeviceBytes {
    /// The fields the shapes fix, in the format's order without the data: what a receiver
    /// needs, in host memory, to read `bytes`.
    pub layout: Vec<u8>,
    /// The whole message in `wire`'s format, a one-dimensional uint8 tensor on the message's
    /// device (on the CPU for a message without tensors).
    pub bytes: Tensor,
}

/// Fields packed per pass of the bit packer: a multiple of 8, so that every pass ends on a
/// byte, and small enough that its [fields, width] bits stay a few MiB.
const FIELDS_PER_PASS: i64 = 1 << 16;

/// `fields` (int64, one dimension) as `width`-bit fields packed least-significant bit first,
/// the last byte padded with zeros: `wire`'s bit writer, on the device.
fn pack(fields: &Tensor, width: u32) -> Tensor {
    let n = fields.size()[0];
    let device = fields.device();
    if width.is_multiple_of(8) {
        // Whole bytes: the low width/8 bytes of each little-endian int64.
        return fields
            .contiguous()
            .view_dtype(Kind::Uint8)
            .view([n, 8])
            .narrow(1, 0, (width / 8) as i64)
            .reshape([-1]);
    }
    let shifts = Tensor::arange(width as i64, (Kind::Int64, device));
    let place = Tensor::ones([8], (Kind::Int64, device))
        .bitwise_left_shift(&Tensor::arange(8, (Kind::Int64, device)));
    let mut parts = Vec::new();
    let mut start = 0;
    while start < n {
        let m = FIELDS_PER_PASS.min(n - start);
        let bits = fields
            .narrow(0, start, m)
            .unsqueeze(1)
            .bitwise_right_shift(&shifts)
            .bitwise_and(1)
            .reshape([-1]);
        let pad = (8 - bits.numel() as i64 % 8) % 8;
        let bits = match pad {
            0 => bits,
            _ => Tensor::cat(&[bits, Tensor::zeros([pad], (Kind::Int64, device))], 0),
        };
        parts.push(
            (bits.view([-1, 8]) * &place)
                .sum_dim_intlist(1, false, Kind::Int64)
                .to_kind(Kind::Uint8),
        );
        start += m;
    }
    match parts.len() {
        0 => Tensor::zeros([0], (Kind::Uint8, device)),
        _ => Tensor::cat(&parts, 0),
    }
}

/// The inverse of `pack`: `count` fields of `width` bits from `bytes` (uint8, exactly
/// ⌈count·width/8⌉ of them), as int64.
fn unpack(bytes: &Tensor, count: i64, width: u32) -> Tensor {
    let device = bytes.device();
    if width.is_multiple_of(8) {
        let wide = (width / 8) as i64;
        let low = bytes.view([count, wide]);
        let high = Tensor::zeros([count, 8 - wide], (Kind::Uint8, device));
        return Tensor::cat(&[low, high], 1)
            .contiguous()
            .view_dtype(Kind::Int64)
            .reshape([-1]);
    }
    let shifts = Tensor::arange(width as i64, (Kind::Int64, device));
    let eight = Tensor::arange(8, (Kind::Int64, device));
    let bytes_per_pass = FIELDS_PER_PASS * width as i64 / 8;
    let mut parts = Vec::new();
    let (mut done, mut at) = (0, 0);
    while done < count {
        let m = FIELDS_PER_PASS.min(count - done);
        let used = (m * width as i64 + 7) / 8;
        let bits = bytes
            .narrow(0, at, used)
            .to_kind(Kind::Int64)
            .unsqueeze(1)
            .bitwise_right_shift(&eight)
            .bitwise_and(1)
            .reshape([-1])
            .narrow(0, 0, m * width as i64)
            .view([m, width as i64]);
        parts.push(
            bits.bitwise_left_shift(&shifts)
                .sum_dim_intlist(1, false, Kind::Int64),
        );
        done += m;
        at += bytes_per_pass;
    }
    match parts.len() {
        0 => Tensor::zeros([0], (Kind::Int64, device)),
        _ => Tensor::cat(&parts, 0),
    }
}

/// The bytes `wire` writes for `values` at `value_bits` each (f16 and f64 whole; f32 as the top
/// `value_bits` bits of its bit pattern).
fn pack_values(values: &Tensor, value_bits: u32) -> Result<Tensor> {
    let flat = values.reshape([-1]).contiguous();
    match values.kind() {
        Kind::Half | Kind::Double => Ok(flat.view_dtype(Kind::Uint8)),
        Kind::Float if value_bits == 32 => Ok(flat.view_dtype(Kind::Uint8)),
        Kind::Float => {
            let patterns = flat
                .view_dtype(Kind::Int)
                .to_kind(Kind::Int64)
                .bitwise_and(0xffff_ffffi64)
                .bitwise_right_shift_tensor_scalar((32 - value_bits) as i64);
            Ok(pack(&patterns, value_bits))
        }
        other => Err(bad(format!(
            "payload values of kind {other:?}: expected f32, f64 or f16"
        ))),
    }
}

/// `count` values of `dtype` (`wire`'s codes) at `value_bits` from their bytes.
fn unpack_values(bytes: &Tensor, count: i64, value_bits: u32, dtype: u8) -> Result<Tensor> {
    // A copy of its own: a section may start at any byte, and a wider view needs alignment.
    let own = || bytes.copy();
    Ok(match dtype {
        2 => own().view_dtype(Kind::Half),
        1 => own().view_dtype(Kind::Double),
        0 if value_bits == 32 => own().view_dtype(Kind::Float),
        0 => {
            let shift = (32 - value_bits) as i64;
            let patterns = unpack(bytes, count, value_bits).bitwise_left_shift_tensor_scalar(shift);
            // Back to a signed 32-bit pattern (two's complement) before the float view.
            let wrapped = &patterns - patterns.ge(1i64 << 31).to_kind(Kind::Int64) * (1i64 << 32);
            wrapped.to_kind(Kind::Int).view_dtype(Kind::Float)
        }
        other => {
            return Err(bad(format!(
                "dtype {other}: expected 0 (f32), 1 (f64) or 2 (f16)"
            )))
        }
    })
}

/// Bytes of `count` values of `dtype` at `value_bits`.
fn value_bytes(count: i64, value_bits: u32, dtype: u8) -> i64 {
    match dtype {
        2 => 2 * count,
        1 => 8 * count,
        _ => (count * value_bits as i64 + 7) / 8,
    }
}

/// The message's sections in order: layout bytes (host) and data (device), as `encode` joins
/// them.
enum Section {
    Layout(Vec<u8>),
    Data(Tensor),
}

#[derive(Default)]
struct Sections(Vec<Section>);

impl Sections {
    /// Where the next layout bytes go (the last section, when it is layout).
    fn layout(&mut self) -> &mut Vec<u8> {
        if !matches!(self.0.last(), Some(Section::Layout(_))) {
            self.0.push(Section::Layout(Vec::new()));
        }
        match self.0.last_mut() {
            Some(Section::Layout(bytes)) => bytes,
            _ => unreachable!("a layout section was just pushed"),
        }
    }

    fn data(&mut self, bytes: Tensor) {
        self.0.push(Section::Data(bytes));
    }
}

/// The message as its layout and its bytes on the device (`DeviceBytes`), nothing read back.
/// An error for a message whose size depends on its values (`Message::has_pending_size`), or
/// for a field outside the format.
pub fn encode(message: &Message) -> Result<DeviceBytes> {
    if message.has_pending_size() {
        return Err(bad(
            "a message whose size depends on its values (threshold-v, Elias gamma) has no layout before the device is read: send it through host memory",
        ));
    }
    let device = message
        .payloads
        .iter()
        .map(Payload::device)
        .chain(message.flags.iter().map(Tensor::device))
        .next()
        .unwrap_or(Device::Cpu);
    let mut s = Sections::default();
    s.layout().extend_from_slice(MAGIC);
    s.layout().push(VERSION);
    put_u32(s.layout(), message.flags.len(), "flag count")?;
    if !message.flags.is_empty() {
        let flags: Vec<Tensor> = message.flags.iter().map(|f| f.reshape([1])).collect();
        s.data(pack(&Tensor::cat(&flags, 0).to_kind(Kind::Int64), 1));
    }
    put_u32(s.layout(), message.payloads.len(), "payload count")?;
    for payload in &message.payloads {
        match payload {
            Payload::Dense { values, value_bits } | Payload::Cast { values, value_bits } => {
                let kind = match payload {
                    Payload::Dense { .. } => DENSE,
                    _ => CAST,
                };
                put_shape(s.layout(), kind, dtype_code(values.kind())?, &values.size())?;
                s.layout().push(*value_bits as u8);
                s.data(pack_values(values, *value_bits)?);
            }
            Payload::Sparse {
                indices,
                values,
                shape,
                value_bits,
                index_bits,
            } => {
                put_shape(s.layout(), SPARSE, dtype_code(values.kind())?, shape)?;
                s.layout()
                    .extend_from_slice(&[*value_bits as u8, *index_bits as u8]);
                put_u32(s.layout(), indices.numel(), "kept elements")?;
                s.data(pack(
                    &indices.reshape([-1]).to_kind(Kind::Int64),
                    *index_bits,
                ));
                s.data(pack_values(values, *value_bits)?);
            }
            Payload::LowRank { p, q, shape } => {
                put_shape(s.layout(), LOW_RANK, dtype_code(p.kind())?, shape)?;
                put_u32(s.layout(), p.size()[1] as usize, "rank")?;
                put_u32(s.layout(), p.size()[0] as usize, "rows")?;
                put_u32(s.layout(), q.size()[0] as usize, "cols")?;
                s.data(pack_values(p, 32)?);
                s.data(pack_values(q, 32)?);
            }
            Payload::Quantized {
                codes,
                scales,
                bucket,
                levels,
                code,
                shape,
            } => {
                put_shape(s.layout(), QUANTIZED, 0, shape)?;
                let (code_kind, magnitude_bits) = match code {
                    LevelCode::Sign => (CODE_SIGN, 0),
                    LevelCode::SignMagnitude { magnitude_bits } => {
                        (CODE_SIGN_MAGNITUDE, *magnitude_bits)
                    }
                    LevelCode::EliasGamma => unreachable!("refused above: a pending size"),
                };
                s.layout()
                    .extend_from_slice(&[code_kind, magnitude_bits as u8]);
                put_u32(s.layout(), *levels as usize, "levels")?;
                put_u32(s.layout(), *bucket as usize, "bucket")?;
                put_u32(s.layout(), scales.numel(), "scale count")?;
                s.data(pack_values(&scales.to_kind(Kind::Float), 32)?);
                let codes = codes.reshape([-1]).to_kind(Kind::Int64);
                s.data(match code {
                    LevelCode::Sign => pack(&codes.gt(0).to_kind(Kind::Int64), 1),
                    _ => {
                        let fields = codes.lt(0).to_kind(Kind::Int64)
                            + codes.abs().bitwise_left_shift_tensor_scalar(1);
                        pack(&fields, 1 + magnitude_bits)
                    }
                });
            }
            Payload::Masked { .. } => unreachable!("refused above: a pending size"),
        }
    }
    // The layout goes to the device once; the message is its sections joined there.
    let layout: Vec<u8> =
        s.0.iter()
            .flat_map(|section| match section {
                Section::Layout(bytes) => bytes.clone(),
                Section::Data(_) => Vec::new(),
            })
            .collect();
    let uploaded = host::upload(&Tensor::from_slice(&layout), device);
    let mut at = 0;
    let parts: Vec<Tensor> =
        s.0.iter()
            .map(|section| match section {
                Section::Layout(bytes) => {
                    let part = uploaded.narrow(0, at, bytes.len() as i64);
                    at += bytes.len() as i64;
                    part
                }
                Section::Data(t) => t.shallow_clone(),
            })
            .collect();
    Ok(DeviceBytes {
        layout,
        bytes: Tensor::cat(&parts, 0),
    })
}

/// Walks the device bytes beside the layout: a layout field read from the host advances both;
/// a data section advances the device bytes alone.
struct Walk<'a> {
    layout: Reader<'a>,
    bytes: &'a Tensor,
    at: i64,
}

impl Walk<'_> {
    fn u8(&mut self, what: &str) -> Result<u8> {
        self.at += 1;
        self.layout.u8(what)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        self.at += 4;
        self.layout.u32(what)
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8]> {
        self.at += n as i64;
        self.layout.take(n, what)
    }
    /// The next `n` bytes of data, on the device.
    fn data(&mut self, n: i64, what: &str) -> Result<Tensor> {
        let total = self.bytes.size()[0];
        if self.at + n > total {
            return Err(bad(format!(
                "{total} bytes end at {} while reading {what} ({n} bytes needed)",
                self.at
            )));
        }
        let part = self.bytes.narrow(0, self.at, n);
        self.at += n;
        Ok(part)
    }
    fn values(&mut self, count: i64, value_bits: u32, dtype: u8) -> Result<Tensor> {
        if dtype == 0 && !(9..=32).contains(&value_bits) {
            return Err(bad(format!("value_bits {value_bits}: expected 9..=32")));
        }
        let bytes = self.data(value_bytes(count, value_bits, dtype), "values")?;
        unpack_values(&bytes, count, value_bits, dtype)
    }
}

/// The message from its layout and its bytes on a device (`encode`'s two halves, possibly of
/// another rank), its tensors on the bytes' device: the same message `Message::from_bytes`
/// reads from the same bytes. Errors say which field of which payload was wrong.
pub fn decode(layout: &[u8], bytes: &Tensor) -> Result<Message> {
    let mut w = Walk {
        layout: Reader {
            bytes: layout,
            at: 0,
        },
        bytes,
        at: 0,
    };
    let magic = w.take(4, "magic")?;
    if magic != MAGIC {
        return Err(bad(format!("magic {magic:?}: expected {MAGIC:?}")));
    }
    let version = w.u8("version")?;
    if !(OLDEST_VERSION..=VERSION).contains(&version) {
        return Err(bad(format!(
            "version {version}: this build reads versions {OLDEST_VERSION} to {VERSION}"
        )));
    }
    let flag_count = w.u32("flag count")? as i64;
    let flags = match flag_count {
        0 => Vec::new(),
        n => {
            let bits = unpack(&w.data((n + 7) / 8, "flags")?, n, 1).eq(1);
            (0..n).map(|i| bits.select(0, i)).collect()
        }
    };
    let payload_count = w.u32("payload count")? as usize;
    let mut payloads = Vec::with_capacity(payload_count.min(1 << 16));
    for i in 0..payload_count {
        let kind = w.u8("payload kind")?;
        let dtype = w.u8("payload dtype")?;
        let ndim = w.u8("payload ndim")? as usize;
        let shape = (0..ndim)
            .map(|_| w.u32("dimension").map(|d| d as i64))
            .collect::<Result<Vec<i64>>>()?;
        let numel: i64 = shape.iter().product();
        let named = |e: crate::error::Error| bad(format!("payload {i}: {e}"));
        payloads.push(match kind {
            DENSE | CAST => {
                let value_bits = w.u8("value bits")? as u32;
                let values = w
                    .values(numel, value_bits, dtype)
                    .map_err(named)?
                    .view(shape.as_slice());
                match kind {
                    DENSE => Payload::Dense { values, value_bits },
                    _ => Payload::Cast { values, value_bits },
                }
            }
            SPARSE => {
                let value_bits = w.u8("value bits")? as u32;
                let index_bits = w.u8("index bits")? as u32;
                if !(1..=32).contains(&index_bits) {
                    return Err(bad(format!(
                        "payload {i}: index bits {index_bits}: expected 1..=32"
                    )));
                }
                let k = w.u32("kept elements")? as i64;
                let positions = w.data((k * index_bits as i64 + 7) / 8, "indices")?;
                let indices = unpack(&positions, k, index_bits);
                let values = w.values(k, value_bits, dtype).map_err(named)?;
                Payload::Sparse {
                    indices,
                    values,
                    shape,
                    value_bits,
                    index_bits,
                }
            }
            LOW_RANK => {
                let rank = w.u32("rank")? as i64;
                let rows = w.u32("rows")? as i64;
                let cols = w.u32("cols")? as i64;
                let p = w.values(rows * rank, 32, dtype).map_err(named)?;
                let q = w.values(cols * rank, 32, dtype).map_err(named)?;
                Payload::LowRank {
                    p: p.view([rows, rank]),
                    q: q.view([cols, rank]),
                    shape,
                }
            }
            QUANTIZED => get_quantized(&mut w, shape).map_err(named)?,
            other => {
                return Err(bad(format!(
                    "payload {i}: kind {other}: expected 0 (dense), 1 (sparse), 2 (low rank), 3 (quantised) or 4 (cast)"
                )))
            }
        });
    }
    if w.layout.at != layout.len() {
        return Err(bad(format!(
            "{} layout bytes left after the last payload",
            layout.len() - w.layout.at
        )));
    }
    if w.at != bytes.size()[0] {
        return Err(bad(format!(
            "{} bytes left after the last payload",
            bytes.size()[0] - w.at
        )));
    }
    Ok(Message { payloads, flags })
}

/// A quantised payload (kind 3) of `shape`: signs or sign-magnitude codes, unpacked on the
/// device into int32 codes as `wire` reads them.
fn get_quantized(w: &mut Walk, shape: Vec<i64>) -> Result<Payload> {
    let numel: i64 = shape.iter().product();
    let code_kind = w.u8("code")?;
    let magnitude_bits = w.u8("magnitude bits")? as u32;
    let levels = w.u32("levels")?;
    let bucket = w.u32("bucket")? as i64;
    let scale_count = w.u32("scale count")? as i64;
    if levels == 0 {
        return Err(bad("levels 0: expected at least 1"));
    }
    if scale_count > 0 && (bucket < 1 || scale_count != (numel + bucket - 1) / bucket) {
        return Err(bad(format!(
            "{scale_count} scales for {numel} elements in buckets of {bucket}: expected ceil(numel / bucket)"
        )));
    }
    let scales = w.values(scale_count, 32, 0)?;
    let (codes, code) = match code_kind {
        CODE_SIGN => {
            let bits = unpack(&w.data((numel + 7) / 8, "signs")?, numel, 1);
            (bits * 2 - 1, LevelCode::Sign)
        }
        CODE_SIGN_MAGNITUDE => {
            if !(1..=31).contains(&magnitude_bits) {
                return Err(bad(format!(
                    "magnitude bits {magnitude_bits}: expected 1..=31"
                )));
            }
            let width = 1 + magnitude_bits;
            let fields = unpack(
                &w.data((numel * width as i64 + 7) / 8, "codes")?,
                numel,
                width,
            );
            let magnitude = fields.bitwise_right_shift_tensor_scalar(1);
            let negative = fields.bitwise_and(1);
            (
                &magnitude - negative * 2 * &magnitude,
                LevelCode::SignMagnitude { magnitude_bits },
            )
        }
        CODE_ELIAS => {
            return Err(bad(
                "Elias-gamma codes have no layout before the device is read: they cross through host memory",
            ))
        }
        other => {
            return Err(bad(format!(
                "code {other}: expected 0 (sign) or 1 (sign-magnitude)"
            )))
        }
    };
    Ok(Payload::Quantized {
        codes: codes.to_kind(Kind::Int),
        scales,
        bucket,
        levels,
        code,
        shape,
    })
}
