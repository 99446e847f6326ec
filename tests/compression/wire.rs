//! Messages through bytes and back (`compress::wire`, issue 16): every compressor's message
//! decodes to the very same tensors, the byte length is the payload bits plus the documented
//! headers, and malformed bytes are refused with the field named.

use crate::common;
use dpcomp::compress::wire::{HEADER_BYTES, PAYLOAD_HEADER_BYTES};
use dpcomp::compress::wire_on_device;
use dpcomp::compress::{Compressor, CompressorKind, Message, Payload, Setting};
use dpcomp::config::CompressionSettings;
use tch::{Device, Kind, Tensor};

/// Shapes with a matrix, a conv kernel, a vector and a scalar-like tensor.
fn shapes() -> Vec<Vec<i64>> {
    vec![vec![64, 300], vec![16, 3, 3, 3], vec![300], vec![1]]
}

fn bits_of(t: &Tensor) -> Vec<i64> {
    // Bit patterns, so that -0.0 vs 0.0 or NaN payloads would not pass as equal.
    let flat = t.reshape([-1]).to_kind(Kind::Float);
    Vec::<f32>::try_from(&flat)
        .unwrap()
        .into_iter()
        .map(|v| v.to_bits() as i64)
        .collect()
}

/// Header bytes of a message: fixed part, flag bits, each payload's own header and padding.
fn header_bound(message: &Message) -> usize {
    let payloads: usize = message
        .payloads
        .iter()
        .map(|p| match p {
            Payload::Dense { values, .. } => PAYLOAD_HEADER_BYTES + 4 * values.dim() + 1 + 1,
            Payload::Sparse { shape, .. } => PAYLOAD_HEADER_BYTES + 4 * shape.len() + 2 + 4 + 2,
            Payload::LowRank { shape, .. } => PAYLOAD_HEADER_BYTES + 4 * shape.len() + 12,
            Payload::Cast { values, .. } => PAYLOAD_HEADER_BYTES + 4 * values.dim() + 1 + 1,
            // Code, widths, levels, bucket, scale count, the nonzero count, padding.
            Payload::Quantized { shape, scales, .. } => {
                PAYLOAD_HEADER_BYTES + 4 * shape.len() + 14 + 4 * scales.numel() + 4 + 1
            }
            Payload::Masked { values, .. } => PAYLOAD_HEADER_BYTES + 4 * values.dim() + 2 + 4 + 2,
        })
        .sum();
    HEADER_BYTES + message.flags.len().div_ceil(8) + payloads
}

fn round_trip(name: &str, spec: Compressor) {
    let shapes = shapes();
    // One encoder; one decoder reads the bytes, another the message in memory.
    let mut encoder = spec.encoder(&shapes, Device::Cpu).unwrap();
    let mut over_bytes = spec.decoder(&shapes, Device::Cpu).unwrap();
    let mut in_memory = spec.decoder(&shapes, Device::Cpu).unwrap();
    for step in 0..3 {
        let mut draws = common::Draws::new(10 + step);
        let update: Vec<Tensor> = shapes.iter().map(|s| draws.randn(s, Kind::Float)).collect();
        let message = encoder.encode(&update);
        let bytes = message.to_bytes().unwrap();
        // What `grid --list` estimates without encoding is the length the encoding has.
        assert_eq!(
            dpcomp::compress::wire::encoded_len(&message),
            bytes.len(),
            "{name}"
        );
        let decoded = Message::from_bytes(&bytes, Device::Cpu).unwrap();
        same_bytes_on_the_device(name, &message, &bytes, &decoded);
        assert_eq!(decoded.payloads.len(), message.payloads.len(), "{name}");
        assert_eq!(decoded.flags.len(), message.flags.len(), "{name}");
        for (a, b) in decoded.flags.iter().zip(&message.flags) {
            assert_eq!(a.int64_value(&[]), b.int64_value(&[]), "{name}: flag");
        }
        for (a, b) in decoded.payloads.iter().zip(&message.payloads) {
            assert_eq!(
                bits_of(&a.to_dense()),
                bits_of(&b.to_dense()),
                "{name} step {step}: reconstruction differs after the bytes"
            );
            assert_eq!(a.wire_bits(), b.wire_bits(), "{name}");
        }
        // The decoders (stateful for Denoise) reconstruct the same update from either.
        let (from_bytes, from_memory) = (over_bytes.decode(&decoded), in_memory.decode(&message));
        assert_eq!(from_bytes.len(), shapes.len(), "{name}");
        for ((a, b), shape) in from_bytes.iter().zip(&from_memory).zip(&shapes) {
            assert_eq!(&a.size(), shape, "{name}: decoded shape");
            assert_eq!(
                bits_of(a),
                bits_of(b),
                "{name} step {step}: decoded update differs"
            );
        }
        // What the bytes cost: the payload bits, plus headers and byte padding, nothing more.
        let measured = 8 * bytes.len() as u64;
        let content = message.wire_bits();
        assert!(measured >= content, "{name}: {measured} < {content}");
        assert!(
            measured - content <= 8 * header_bound(&message) as u64,
            "{name}: {measured} bits for {content} of payload"
        );
    }
}

/// The bytes made where the tensors live (`wire_on_device`) are `wire`'s, byte for byte, and
/// read back to the message `wire` reads; a message whose size depends on its values is
/// refused there (it crosses through host memory).
fn same_bytes_on_the_device(name: &str, message: &Message, bytes: &[u8], decoded: &Message) {
    let on_device = match wire_on_device::encode(message) {
        Ok(on_device) => on_device,
        Err(e) => {
            assert!(message.has_pending_size(), "{name}: {e}");
            assert!(e.to_string().contains("host memory"), "{name}: {e}");
            return;
        }
    };
    assert!(!message.has_pending_size(), "{name}");
    assert_eq!(
        Vec::<u8>::try_from(&on_device.bytes).unwrap(),
        bytes,
        "{name}: device bytes"
    );
    assert!(
        on_device.layout.len() < bytes.len().max(14),
        "{name}: layout"
    );
    let read = wire_on_device::decode(&on_device.layout, &on_device.bytes).unwrap();
    assert_eq!(read.flags.len(), decoded.flags.len(), "{name}");
    for (a, b) in read.flags.iter().zip(&decoded.flags) {
        assert_eq!(a.int64_value(&[]), b.int64_value(&[]), "{name}: flag");
    }
    for (a, b) in read.payloads.iter().zip(&decoded.payloads) {
        assert_eq!(
            bits_of(&a.to_dense()),
            bits_of(&b.to_dense()),
            "{name}: device read"
        );
        assert_eq!(a.wire_bits(), b.wire_bits(), "{name}");
    }
    // A layout cut short, or bytes with one too many, are refused naming what was wrong.
    let cut = wire_on_device::decode(
        &on_device.layout[..on_device.layout.len() - 1],
        &on_device.bytes,
    );
    assert!(cut.is_err(), "{name}: a short layout was read");
    let longer = Tensor::cat(
        &[
            on_device.bytes.shallow_clone(),
            Tensor::zeros([1], (Kind::Uint8, Device::Cpu)),
        ],
        0,
    );
    let e = match wire_on_device::decode(&on_device.layout, &longer) {
        Ok(_) => panic!("{name}: bytes with one too many were read"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("1 bytes left after the last payload"),
        "{name}: {e}"
    );
}

#[test]
fn every_compressor_round_trips_through_bytes_bit_for_bit() {
    let _serial = common::serial();
    let spec = |kind, rate, rank, options: &[&str]| {
        let options = Setting::parse_all(options).unwrap();
        CompressionSettings::from_flags(kind, Some(rate), Some(rank), options)
            .unwrap()
            .compressor
    };
    round_trip("identity", spec(CompressorKind::Identity, 1.0, 1, &[]));
    round_trip("dgc x16", spec(CompressorKind::Dgc, 16.0, 1, &[]));
    round_trip("dgc x256", spec(CompressorKind::Dgc, 256.0, 1, &[]));
    // Low-order bit removal and minimal index widths: fields that are not whole bytes.
    round_trip(
        "dgc x16 value_bits 16 minimal indices",
        spec(
            CompressorKind::Dgc,
            16.0,
            1,
            &["value_bits=16", "index_bits=min"],
        ),
    );
    round_trip(
        "dgc x4 value_bits 12",
        spec(CompressorKind::Dgc, 4.0, 1, &["value_bits=12"]),
    );
    round_trip("denoise x16", spec(CompressorKind::Denoise, 16.0, 1, &[]));
    round_trip("powersgd r1", spec(CompressorKind::Powersgd, 1.0, 1, &[]));
    round_trip("powersgd r4", spec(CompressorKind::Powersgd, 1.0, 4, &[]));
    // Issue 40's families: quantised codes (fixed widths and Elias gamma), casts, random-k's
    // values, threshold-v's data-dependent count.
    round_trip("qsgd", spec(CompressorKind::Qsgd, 1.0, 1, &[]));
    round_trip(
        "qsgd elias",
        spec(
            CompressorKind::Qsgd,
            1.0,
            1,
            &["levels=2", "encoding=elias"],
        ),
    );
    round_trip("terngrad", spec(CompressorKind::Terngrad, 1.0, 1, &[]));
    round_trip("signsgd", spec(CompressorKind::Signsgd, 1.0, 1, &[]));
    round_trip("ef-signsgd", spec(CompressorKind::EfSignsgd, 1.0, 1, &[]));
    round_trip("randomk", spec(CompressorKind::Randomk, 8.0, 1, &[]));
    round_trip(
        "threshold",
        spec(CompressorKind::Threshold, 1.0, 1, &["threshold=1"]),
    );
    round_trip("fp16", spec(CompressorKind::Fp16, 1.0, 1, &[]));
    round_trip("bf16", spec(CompressorKind::Bf16, 1.0, 1, &[]));
    round_trip("int8", spec(CompressorKind::Int8, 1.0, 1, &[]));
    round_trip("natural", spec(CompressorKind::Natural, 1.0, 1, &[]));
}

#[test]
fn dense_fp32_message_costs_its_values_plus_a_fixed_header() {
    let _serial = common::serial();
    let values = Tensor::randn([10, 7], (Kind::Float, Device::Cpu));
    let message = Message::new(vec![Payload::Dense {
        values,
        value_bits: 32,
    }]);
    let bytes = message.to_bytes().unwrap();
    // 13 header bytes, then kind, dtype, ndim, two u32 dims, value_bits, 70 x 4 value bytes.
    assert_eq!(bytes.len(), HEADER_BYTES + 3 + 8 + 1 + 280);
    assert_eq!(&bytes[..4], b"DPCM");
}

#[test]
fn malformed_bytes_are_refused_naming_the_field() {
    let message = Message::new(vec![Payload::Sparse {
        indices: Tensor::from_slice(&[1i64, 5]),
        values: Tensor::from_slice(&[0.5f32, -2.0]),
        shape: vec![8],
        value_bits: 32,
        index_bits: 3,
    }]);
    let bytes = message.to_bytes().unwrap();
    let err = |b: &[u8]| {
        Message::from_bytes(b, Device::Cpu)
            .err()
            .expect("refused")
            .to_string()
    };
    assert!(
        err(&bytes[..bytes.len() - 1]).contains("values"),
        "{}",
        err(&bytes[..bytes.len() - 1])
    );
    let mut wrong = bytes.clone();
    wrong[0] = b'X';
    assert!(err(&wrong).contains("magic"));
    let mut wrong = bytes.clone();
    wrong[4] = 9;
    assert!(err(&wrong).contains("version 9"));
    // Version 1 (before the quantised and cast payloads) still reads; its kinds are a subset.
    assert_eq!(bytes[4], 2, "this build writes version 2");
    let mut first = bytes.clone();
    first[4] = 1;
    assert!(Message::from_bytes(&first, Device::Cpu).is_ok());
    let cast = Message::new(vec![Payload::Cast {
        values: Tensor::from_slice(&[0.5f32, -2.0]).to_kind(Kind::Half),
        value_bits: 16,
    }])
    .to_bytes()
    .unwrap();
    let mut old = cast.clone();
    old[4] = 1;
    assert!(err(&old).contains("kind 4"), "{}", err(&old));
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(err(&longer).contains("left after"));
    // An index past the tensor: shape 8 -> 2, with index 5 still encoded.
    let small = Message::new(vec![Payload::Sparse {
        indices: Tensor::from_slice(&[1i64, 5]),
        values: Tensor::from_slice(&[0.5f32, -2.0]),
        shape: vec![2],
        value_bits: 32,
        index_bits: 3,
    }]);
    assert!(err(&small.to_bytes().unwrap()).contains("index 5 outside"));
}
