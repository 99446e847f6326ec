//! QSGD's variable-length code of quantised levels, Code_s (Alistarh, Grubic, Li, Tomioka,
//! Vojnovic, "QSGD: Communication-Efficient SGD via Gradient Quantization and Encoding", NeurIPS
//! 2017, section 3.2): the levels are mostly zero at few levels, so instead of a fixed width per
//! element it writes, for each nonzero level in order, the Elias-gamma code of the run of zeros
//! before it (plus one), its sign, and the Elias-gamma code of the level.
//!
//! Elias gamma of x >= 1: floor(log2 x) zeros, then x's floor(log2 x) + 1 binary digits, most
//! significant first: 2 floor(log2 x) + 1 bits (1 -> `1`, 2 -> `010`, 5 -> `00101`).
//!
//! `code_bits` counts a tensor's code on its device without reading it (what a training step
//! records); `write` and `read` make and parse the bits on the host, where bytes are made.

use crate::error::{Error, Result};
use tch::{Kind, Tensor};

/// Bits of the Elias-gamma code of `x` >= 1: 2 floor(log2 x) + 1.
pub fn gamma_len(x: u64) -> u32 {
    debug_assert!(x >= 1);
    2 * (63 - x.leading_zeros()) + 1
}

/// The length in bits of Code_s for `codes` (flat integer levels, signed), as a 0-d int64 tensor
/// on their device: for each nonzero code, gamma(zeros since the previous nonzero + 1) + 1 sign
/// bit + gamma(|code|). No host read: the run lengths come from a running maximum of the
/// nonzero positions.
pub fn code_bits(codes: &Tensor) -> Tensor {
    let flat = codes.reshape([-1]);
    let n = flat.numel() as i64;
    let device = flat.device();
    if n == 0 {
        return Tensor::zeros([], (Kind::Int64, device));
    }
    let nonzero = flat.ne(0);
    let positions = Tensor::arange(n, (Kind::Int64, device));
    // The latest nonzero position at or before i (-1 before the first one).
    let marks = positions.where_scalarother(&nonzero, -1);
    let (latest, _) = marks.cummax(0);
    // ... strictly before i: shifted by one.
    let before = Tensor::cat(
        &[
            Tensor::full([1], -1, (Kind::Int64, device)),
            latest.narrow(0, 0, n - 1),
        ],
        0,
    );
    let run = &positions - before; // zeros before i, plus one
    let magnitude = flat.abs().to_kind(Kind::Int64).clamp_min(1);
    let bits = gamma_len_tensor(&run) + 1 + gamma_len_tensor(&magnitude);
    bits.where_scalarother(&nonzero, 0).sum(Kind::Int64)
}

/// 2 floor(log2 x) + 1 for every x >= 1 of an int64 tensor, exactly (floor(log2) as the index
/// of the highest set bit: a double's exponent, exact below 2^53).
fn gamma_len_tensor(x: &Tensor) -> Tensor {
    let floor_log2 = x.to_kind(Kind::Double).log2().floor().to_kind(Kind::Int64);
    floor_log2 * 2 + 1
}

/// Appends bits in stream order, most significant first within each code, packing each byte
/// from its least significant bit (the bit order of the rest of the wire format).
pub(crate) struct StreamWriter<'a> {
    out: &'a mut Vec<u8>,
    byte: u8,
    filled: u32,
}

impl<'a> StreamWriter<'a> {
    pub(crate) fn new(out: &'a mut Vec<u8>) -> Self {
        StreamWriter {
            out,
            byte: 0,
            filled: 0,
        }
    }

    fn bit(&mut self, bit: bool) {
        self.byte |= (bit as u8) << self.filled;
        self.filled += 1;
        if self.filled == 8 {
            self.out.push(self.byte);
            self.byte = 0;
            self.filled = 0;
        }
    }

    fn gamma(&mut self, x: u64) {
        let top = 63 - x.leading_zeros();
        for _ in 0..top {
            self.bit(false);
        }
        for i in (0..=top).rev() {
            self.bit((x >> i) & 1 == 1);
        }
    }

    /// Pads the last byte with zeros.
    pub(crate) fn finish(self) {
        if self.filled > 0 {
            self.out.push(self.byte);
        }
    }
}

/// Writes Code_s of `codes` (signed levels); returns the bits written.
pub(crate) fn write(out: &mut Vec<u8>, codes: &[i64]) -> u64 {
    let mut w = StreamWriter::new(out);
    let (mut run, mut bits) = (1u64, 0u64);
    for &c in codes {
        if c == 0 {
            run += 1;
            continue;
        }
        w.gamma(run);
        w.bit(c < 0);
        w.gamma(c.unsigned_abs());
        bits += (gamma_len(run) + 1 + gamma_len(c.unsigned_abs())) as u64;
        run = 1;
    }
    w.finish();
    bits
}

/// Reads bits in `write`'s order.
struct StreamReader<'a> {
    bytes: &'a [u8],
    at: u64,
}

impl StreamReader<'_> {
    fn bit(&mut self) -> Result<bool> {
        let byte = self.bytes.get((self.at / 8) as usize).ok_or_else(|| {
            Error::bad_value(
                "message bytes",
                "Elias-gamma codes run past the end of the message",
            )
        })?;
        let bit = (byte >> (self.at % 8)) & 1 == 1;
        self.at += 1;
        Ok(bit)
    }

    fn gamma(&mut self) -> Result<u64> {
        let mut zeros = 0;
        while !self.bit()? {
            zeros += 1;
            if zeros > 62 {
                return Err(Error::bad_value(
                    "message bytes",
                    "an Elias-gamma code longer than 62 zeros",
                ));
            }
        }
        let mut x = 1u64;
        for _ in 0..zeros {
            x = (x << 1) | self.bit()? as u64;
        }
        Ok(x)
    }
}

/// Parses `nonzero` codes of Code_s from `bytes` into `numel` levels; returns them and the
/// bytes the codes took (padded to a byte).
pub(crate) fn read(bytes: &[u8], nonzero: usize, numel: usize) -> Result<(Vec<i64>, usize)> {
    let mut r = StreamReader { bytes, at: 0 };
    let mut codes = vec![0i64; numel];
    let mut position = 0usize;
    for _ in 0..nonzero {
        let run = r.gamma()? as usize;
        let negative = r.bit()?;
        let level = r.gamma()? as i64;
        position = position + run - 1;
        if position >= numel {
            return Err(Error::bad_value(
                "message bytes",
                format!(
                    "an Elias-gamma code places a level at {position}, outside {numel} elements"
                ),
            ));
        }
        codes[position] = if negative { -level } else { level };
        position += 1;
    }
    Ok((codes, r.at.div_ceil(8) as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gamma_codes_are_the_textbook_ones() {
        assert_eq!((gamma_len(1), gamma_len(2), gamma_len(5)), (1, 3, 5));
        let mut out = Vec::new();
        // 5 alone after 0 zeros: gamma(1) = 1, sign 0, gamma(5) = 00101 -> bits 1 0 0 0 1 0 1.
        assert_eq!(write(&mut out, &[5]), 7);
        assert_eq!(out, vec![0b0101_0001]);
    }

    #[test]
    fn counted_on_the_device_as_written_on_the_host() {
        let codes = [0i64, 0, 3, -1, 0, 0, 0, 7, 0, -12, 0, 0];
        let mut out = Vec::new();
        let bits = write(&mut out, &codes);
        let counted = code_bits(&Tensor::from_slice(&codes).to_kind(Kind::Int));
        assert_eq!(crate::host::i64_scalar(&counted) as u64, bits);
        let (back, used) = read(&out, 4, codes.len()).unwrap();
        assert_eq!(back, codes);
        assert_eq!(used, out.len());
    }
}
