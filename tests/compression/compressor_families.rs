//! The compressor families of issue 40 (QSGD, TernGrad, signSGD and EF-signSGD, random-k,
//! threshold-v, fp16, bf16, int8, natural compression): their bytes are the format's size
//! counted by hand, the unbiased ones are unbiased over many draws, error feedback keeps exactly
//! what was not sent, signSGD's receiver takes the majority's sign, settings are checked by
//! name, and under DP they change the bits a run sends, never its ε.

use crate::common;
use dpcomp::compress::wire::{encoded_len, HEADER_BYTES, PAYLOAD_HEADER_BYTES};
use dpcomp::compress::{
    Compressor, CompressorKind, EfSignEncoder, Encoder, Int8, Message, Payload, Qsgd, QsgdEncoding,
    RandomK, Setting, Threshold,
};
use dpcomp::config::CompressionSettings;

/// The compressor `--compressor kind --rate rate --compressor-option ...` give.
fn flags(kind: CompressorKind, rate: f64, options: &[&str]) -> dpcomp::error::Result<Compressor> {
    let options = Setting::parse_all(options)?;
    Ok(CompressionSettings::from_flags(kind, Some(rate), None, options)?.compressor)
}
use tch::{Device, Kind, Tensor};

const CPU: Device = Device::Cpu;

/// A matrix of 19,200 elements (37.5 QSGD buckets of 512) and a vector of 300.
fn shapes() -> Vec<Vec<i64>> {
    vec![vec![64, 300], vec![300]]
}

/// N(0, 1) updates from the test's own generator (`common::Draws`): LibTorch's global one is
/// shared with the other tests of this file, which run in parallel threads.
fn update(seed: u64) -> Vec<Tensor> {
    let mut draws = common::Draws::new(seed);
    shapes()
        .iter()
        .map(|s| draws.randn(s, Kind::Float))
        .collect()
}

fn values(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(&t.reshape([-1]).to_kind(Kind::Float)).unwrap()
}

/// The message of one step of `compressor` on `update(seed)`, and its bytes.
fn message_of(compressor: &Compressor, seed: u64) -> (Message, Vec<u8>) {
    let mut encoder = compressor.encoder(&shapes(), CPU).unwrap();
    let message = encoder.encode(&update(seed));
    let bytes = message.to_bytes().unwrap();
    (message, bytes)
}

/// Bytes of a payload header for a tensor of `ndim` dimensions.
fn head(ndim: usize) -> usize {
    PAYLOAD_HEADER_BYTES + 4 * ndim
}

/// Bits of QSGD's Code_s counted here from the levels, independently of the library: per
/// nonzero level, gamma(zeros before it + 1) + a sign bit + gamma(|level|), with
/// gamma(x) = 2 floor(log2 x) + 1.
fn elias_bits(levels: &[i64]) -> u64 {
    let gamma = |x: u64| 2 * (63 - x.leading_zeros() as u64) + 1;
    let (mut run, mut bits) = (1u64, 0u64);
    for &l in levels {
        if l == 0 {
            run += 1;
        } else {
            bits += gamma(run) + 1 + gamma(l.unsigned_abs());
            run = 1;
        }
    }
    bits
}

#[test]
fn every_family_costs_its_format_by_hand() {
    let _serial = common::serial();
    // (compressor, payload bits of the matrix, of the vector, body header bytes per payload)
    let n = (19_200u64, 300u64);
    // QSGD s = 16: a sign and ceil(log2 17) = 5 level bits per element, a norm per 512.
    let qsgd = Compressor::Qsgd(Qsgd::default());
    // Body header of a quantised payload: code, magnitude bits, levels, bucket, scale count.
    let quantised_head = 2 + 12;
    // Random-k's payloads are its k values, one dimension each.
    let cases: Vec<(&str, Compressor, u64, u64, usize)> = vec![
        (
            "qsgd s16",
            qsgd,
            38 * 32 + n.0 * 6,
            32 + n.1 * 6,
            quantised_head,
        ),
        (
            "qsgd s4 one norm",
            Compressor::Qsgd(Qsgd {
                levels: 4,
                bucket: 0,
                ..Default::default()
            }),
            32 + n.0 * 4,
            32 + n.1 * 4,
            quantised_head,
        ),
        (
            "terngrad",
            Compressor::TernGrad,
            32 + 2 * n.0,
            32 + 2 * n.1,
            quantised_head,
        ),
        ("signsgd", Compressor::SignSgd, n.0, n.1, quantised_head),
        (
            "ef-signsgd",
            Compressor::EfSignSgd,
            32 + n.0,
            32 + n.1,
            quantised_head,
        ),
        (
            "randomk x32",
            Compressor::RandomK(RandomK {
                rate: 32.0,
                ..Default::default()
            }),
            32 * 600,
            32 * 9,
            1,
        ),
        ("fp16", Compressor::Fp16, 16 * n.0, 16 * n.1, 1),
        ("bf16", Compressor::Bf16, 16 * n.0, 16 * n.1, 1),
        (
            "int8",
            Compressor::Int8(Int8::default()),
            32 + 8 * n.0,
            32 + 8 * n.1,
            quantised_head,
        ),
        ("natural", Compressor::Natural, 9 * n.0, 9 * n.1, 1),
    ];
    for (name, compressor, matrix, vector, body_head) in cases {
        let (message, bytes) = message_of(&compressor, 1);
        assert_eq!(message.wire_bits(), matrix + vector, "{name}: payload bits");
        let matrix_dims = if name.starts_with("randomk") { 1 } else { 2 };
        let expected = HEADER_BYTES
            + head(matrix_dims)
            + body_head
            + (matrix as usize).div_ceil(8)
            + head(1)
            + body_head
            + (vector as usize).div_ceil(8);
        assert_eq!(bytes.len(), expected, "{name}: bytes");
        assert_eq!(encoded_len(&message), expected, "{name}: computed length");
        // The paper's unit counts a quantised or cast element at twice its wire bits, random-k's
        // values at 64 each.
        let paper = if name.starts_with("randomk") {
            64 * (600 + 9)
        } else {
            2 * (matrix + vector)
        };
        assert_eq!(message.paper_bits(), paper, "{name}: paper's unit");
    }
}

#[test]
fn data_dependent_sizes_are_the_bytes_they_make() {
    let _serial = common::serial();
    // QSGD's Elias gamma at 4 levels in buckets of 512: mostly zeros, coded as runs.
    let elias = Compressor::Qsgd(Qsgd {
        levels: 4,
        encoding: QsgdEncoding::Elias,
        ..Default::default()
    });
    let (message, bytes) = message_of(&elias, 2);
    let mut expected = HEADER_BYTES;
    let mut payload_bits = 0;
    for p in &message.payloads {
        let Payload::Quantized { codes, scales, .. } = p else {
            panic!("qsgd sends quantised payloads");
        };
        let levels = Vec::<i64>::try_from(&codes.to_kind(Kind::Int64)).unwrap();
        let bits = elias_bits(&levels);
        payload_bits += 32 * scales.numel() as u64 + bits;
        // + the nonzero count (4 bytes) before the codes.
        expected +=
            head(p.to_dense().dim()) + 14 + 4 * scales.numel() + 4 + (bits as usize).div_ceil(8);
    }
    assert_eq!(message.wire_bits(), payload_bits);
    assert_eq!(bytes.len(), expected);
    assert_eq!(encoded_len(&message), expected);
    // Variable length pays: fewer bits than the fixed 1 + 3 bits per element.
    assert!(payload_bits < 19_500 * 4, "{payload_bits}");

    // Threshold-v: every element with |v| >= 1.5 as a 32-bit value and a 32-bit index.
    let threshold = Compressor::Threshold(Threshold {
        threshold: 1.5,
        ..Default::default()
    });
    let (message, bytes) = message_of(&threshold, 3);
    let kept: Vec<u64> = update(3)
        .iter()
        .map(|g| values(g).iter().filter(|v| v.abs() >= 1.5).count() as u64)
        .collect();
    assert!(kept[0] > 1000 && kept[0] < 4000, "{kept:?}"); // about 13% of N(0, 1)
    assert_eq!(message.wire_bits(), 64 * (kept[0] + kept[1]));
    assert_eq!(message.elements(), kept[0] + kept[1]);
    let expected =
        HEADER_BYTES + (head(2) + 6 + 8 * kept[0] as usize) + (head(1) + 6 + 8 * kept[1] as usize);
    assert_eq!(bytes.len(), expected);
    assert_eq!(encoded_len(&message), expected);
    // Read back, it is a sparse payload that decodes to the same tensor.
    let back = Message::from_bytes(&bytes, CPU).unwrap();
    for (a, b) in back.payloads.iter().zip(&message.payloads) {
        assert!(matches!(a, Payload::Sparse { .. }));
        assert_eq!(values(&a.to_dense()), values(&b.to_dense()));
    }
}

#[test]
fn every_family_round_trips_through_bytes_bit_for_bit() {
    let _serial = common::serial();
    let families = [
        "qsgd",
        "qsgd:levels=3,bucket=100,encoding=elias",
        "terngrad",
        "signsgd",
        "ef-signsgd",
        "randomk:rate",
        "randomk:rate,unbiased=true,error_feedback=false",
        "threshold:threshold=0.8,value_bits=12,index_bits=min",
        "fp16",
        "bf16",
        "int8",
        "int8:stochastic=true",
        "natural",
    ];
    for family in families {
        let (kind, rest) = family.split_once(':').unwrap_or((family, ""));
        let kind = CompressorKind::ALL
            .into_iter()
            .find(|k| k.name() == kind)
            .unwrap();
        let rate = if rest.starts_with("rate") { 8.0 } else { 1.0 };
        let options: Vec<&str> = rest.split(',').filter(|o| o.contains('=')).collect();
        let spec = flags(kind, rate, &options).unwrap();
        let mut encoder = spec.encoder(&shapes(), CPU).unwrap();
        let (mut from_bytes, mut in_memory) = (
            spec.decoder(&shapes(), CPU).unwrap(),
            spec.decoder(&shapes(), CPU).unwrap(),
        );
        for step in 0..3 {
            let message = encoder.encode(&update(20 + step));
            let bytes = message.to_bytes().unwrap();
            assert_eq!(encoded_len(&message), bytes.len(), "{family}");
            let back = Message::from_bytes(&bytes, CPU).unwrap();
            let (a, b) = (from_bytes.decode(&back), in_memory.decode(&message));
            for ((x, y), shape) in a.iter().zip(&b).zip(shapes()) {
                assert_eq!(x.size(), shape, "{family}");
                assert_eq!(x.kind(), Kind::Float, "{family}");
                let bits = |t: &Tensor| values(t).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                let (bx, by) = (bits(x), bits(y));
                let differ = bx.iter().zip(&by).filter(|(a, b)| a != b).count();
                assert_eq!(differ, 0, "{family} step {step}: {differ} elements differ");
            }
        }
    }
}

/// The mean of `draws` decodings of one fixed update, and the update. The compressors draw
/// from LibTorch's global generator: the caller holds `common::serial()` so that the draws, and
/// the verdict, are the same from run to run.
fn mean_of_draws(compressor: &Compressor, draws: usize) -> (Vec<f32>, Vec<f32>) {
    let shapes = [vec![40]];
    let g = common::Draws::new(5).randn(&[40], Kind::Float) * 0.3;
    let mut link = compressor.link(&shapes, CPU).unwrap();
    let mut sum = Tensor::zeros([40], (Kind::Float, CPU));
    tch::manual_seed(6);
    for _ in 0..draws {
        sum += &link.round_trip(&[g.shallow_clone()]).1[0];
    }
    (values(&(sum / draws as f64)), values(&g))
}

#[test]
fn the_unbiased_families_are_unbiased_over_many_draws() {
    // Each family's per-element variance is bounded by its paper: QSGD min(n/s², √n/s)||v||²
    // (Lemma 3.1), TernGrad |g| max|g|, natural t²/8, stochastic int8 scale²/4, random-k
    // (n/k - 1) g². With 4,000 draws the mean is within 5 standard errors of g.
    let _serial = common::serial();
    let draws = 4000;
    let cases: Vec<(&str, Compressor)> = vec![
        (
            "qsgd s2",
            Compressor::Qsgd(Qsgd {
                levels: 2,
                bucket: 0,
                ..Default::default()
            }),
        ),
        ("terngrad", Compressor::TernGrad),
        ("natural", Compressor::Natural),
        (
            "int8 stochastic",
            Compressor::Int8(Int8 { stochastic: true }),
        ),
        (
            "randomk unbiased",
            Compressor::RandomK(RandomK {
                rate: 4.0,
                unbiased: true,
                error_feedback: false,
                ..Default::default()
            }),
        ),
    ];
    for (name, compressor) in cases {
        let (mean, g) = mean_of_draws(&compressor, draws);
        let norm = g.iter().map(|v| v * v).sum::<f32>().sqrt();
        let max = g.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, (m, v)) in mean.iter().zip(&g).enumerate() {
            let variance = match name {
                "qsgd s2" => (40f32 / 4.0).min(40f32.sqrt() / 2.0) * norm * norm,
                "terngrad" => v.abs() * max,
                "natural" => v * v / 8.0,
                "int8 stochastic" => (max / 127.0).powi(2) / 4.0,
                _ => 3.0 * v * v,
            };
            let bound = 5.0 * (variance / draws as f32).sqrt() + 1e-6;
            assert!(
                (m - v).abs() <= bound,
                "{name}, element {i}: mean {m} of {draws} draws, true {v}, bound {bound}"
            );
        }
        // Not the identity: a single draw differs from g.
        let mut link = compressor.link(&[vec![40]], CPU).unwrap();
        let one = values(&link.round_trip(&[Tensor::from_slice(&g)]).1[0]);
        assert_ne!(one, g, "{name}");
    }
    // The biased ones are biased: signSGD's mean is the sign.
    let (mean, g) = mean_of_draws(&Compressor::SignSgd, 10);
    for (m, v) in mean.iter().zip(&g) {
        assert_eq!(*m, if *v >= 0.0 { 1.0 } else { -1.0 });
    }
}

#[test]
fn error_feedback_keeps_exactly_what_was_not_sent() {
    // residual_after + sent = update + residual_before, for every step.
    // residual_after + received = update + residual_before, for every step.
    fn check(
        name: &str,
        link: &mut dpcomp::compress::Link,
        residual: &dyn Fn(&dyn Encoder) -> Vec<Tensor>,
    ) {
        let mut before: Vec<Tensor> = shapes()
            .iter()
            .map(|s| Tensor::zeros(s.as_slice(), (Kind::Float, CPU)))
            .collect();
        for step in 0..4 {
            let g = update(30 + step);
            let (_, received) = link.round_trip(&g);
            let after = residual(link.encoder.as_ref());
            assert_eq!(after.len(), g.len(), "{name}: one residual per parameter");
            for (i, sent) in received.iter().enumerate() {
                let gap = (&after[i] + sent - &g[i] - &before[i])
                    .abs()
                    .max()
                    .double_value(&[]);
                assert!(gap < 1e-5, "{name} step {step} tensor {i}: off by {gap}");
            }
            before = after;
        }
    }
    // EF-signSGD's typed encoder shows its error; through the trait, every encoder's state does.
    let mut ef_sign = EfSignEncoder::new(&shapes(), CPU);
    let g = update(40);
    let sent = ef_sign.encode(&g).payloads[0].to_dense();
    let gap = (&ef_sign.errors()[0] + sent - &g[0])
        .abs()
        .max()
        .double_value(&[]);
    assert!(gap < 1e-6, "ef-signsgd: off by {gap}");
    for (name, compressor) in [
        ("ef-signsgd", Compressor::EfSignSgd),
        (
            "randomk",
            Compressor::RandomK(RandomK {
                rate: 8.0,
                ..Default::default()
            }),
        ),
        (
            "threshold",
            Compressor::Threshold(Threshold {
                threshold: 1.0,
                value_bits: 12,
                ..Default::default()
            }),
        ),
    ] {
        let mut link = compressor.link(&shapes(), CPU).unwrap();
        let state = |e: &dyn Encoder| -> Vec<Tensor> {
            e.state()
                .into_iter()
                .filter(|(n, _)| n.starts_with("error.") || n.starts_with("residual."))
                .map(|(_, t)| t.copy())
                .collect()
        };
        check(name, &mut link, &state);
    }
}

#[test]
fn signsgds_receiver_takes_the_majoritys_sign() {
    let spec = Compressor::SignSgd;
    let workers = [
        [1.0f32, -1.0, 0.5, -0.2],
        [2.0, 3.0, -0.5, -0.1],
        [-1.0, -2.0, -0.5, 4.0],
    ];
    let mut decoder = spec.decoder(&[vec![4]], CPU).unwrap();
    let mut sum = Tensor::zeros([4], (Kind::Float, CPU));
    for w in &workers {
        let mut encoder = spec.encoder(&[vec![4]], CPU).unwrap();
        let message = encoder.encode(&[Tensor::from_slice(w)]);
        sum += &decoder.decode(&message)[0];
    }
    let vote = decoder.combine(vec![sum / 3.0]);
    assert_eq!(values(&vote[0]), [1.0, -1.0, -1.0, -1.0]);
    // A tie (two workers) gives 0.
    let tie = decoder.combine(vec![Tensor::from_slice(&[0.0f32, 1.0])]);
    assert_eq!(values(&tie[0]), [0.0, 1.0]);
}

#[test]
fn bad_settings_are_refused_naming_the_setting() {
    let refused = |kind: CompressorKind, rate: f64, options: &[&str], needle: &str| {
        let error = flags(kind, rate, options).unwrap_err().to_string();
        assert!(error.contains(needle), "{kind} {options:?}: {error}");
    };
    refused(CompressorKind::Qsgd, 1.0, &["levels=0"], "levels");
    refused(CompressorKind::Qsgd, 1.0, &["encoding=huffman"], "encoding");
    refused(CompressorKind::Qsgd, 4.0, &[], "rate");
    refused(
        CompressorKind::Threshold,
        1.0,
        &["threshold=-1"],
        "threshold",
    );
    refused(
        CompressorKind::Threshold,
        1.0,
        &["threshold=nan"],
        "threshold",
    );
    refused(CompressorKind::Randomk, 8.0, &["unbiased=true"], "unbiased");
    refused(CompressorKind::Randomk, 0.5, &[], "rate");
    refused(CompressorKind::Int8, 1.0, &["levels=4"], "levels");
    refused(
        CompressorKind::Fp16,
        1.0,
        &["stochastic=true"],
        "stochastic",
    );
    // Typed settings survive their configuration form (`[compression]`'s table).
    for compressor in [
        Compressor::Qsgd(Qsgd {
            levels: 4,
            bucket: 0,
            encoding: QsgdEncoding::Elias,
        }),
        Compressor::RandomK(RandomK {
            rate: 32.0,
            seed: 9,
            unbiased: true,
            error_feedback: false,
        }),
        Compressor::Threshold(Threshold {
            threshold: 0.25,
            value_bits: 16,
            ..Default::default()
        }),
        Compressor::Int8(Int8 { stochastic: true }),
        Compressor::TernGrad,
        Compressor::SignSgd,
        Compressor::EfSignSgd,
        Compressor::Fp16,
        Compressor::Bf16,
        Compressor::Natural,
    ] {
        let table = toml::to_string(&CompressionSettings::new(compressor.clone())).unwrap();
        let back: CompressionSettings = toml::from_str(&table).unwrap();
        assert_eq!(back.compressor, compressor, "{table}");
    }
}

/// Under DP every family is post-processing: the same ε as the uncompressed run, and the bits it
/// logs are its own. A short Surnames run (32 Poisson steps).
#[test]
fn families_change_bits_never_epsilon() {
    let _serial = common::serial();
    let Some(root) = common::require_shared_data() else {
        return;
    };
    use dpcomp::config::DeviceChoice;
    use dpcomp_lab::Task;
    let mut base = dpcomp_lab::tasks::paper_defaults(Task::Surnames);
    base.epochs = 1;
    base.data.limit_train = Some(1000);
    base.data.limit_test = Some(200);
    base.data.data_dir = Some(root);
    base.device = DeviceChoice::Cpu;
    base.seed = 5;
    base.privacy.noise_multiplier = Some(0.8);
    let work = tempfile::tempdir().unwrap();
    let run = |kind: CompressorKind, rate: f64, options: &[&str]| {
        let mut c = base.clone();
        c.compression = CompressionSettings::from_flags(
            kind,
            Some(rate),
            None,
            Setting::parse_all(options).unwrap(),
        )
        .unwrap();
        let dir = work.path().join(format!("{kind}-{}", options.join("-")));
        let summary = dpcomp_lab::tasks::start(c, &dir).unwrap().run().unwrap();
        (summary.epsilon, summary.upstream_gigabits)
    };
    let (epsilon, dense_bits) = run(CompressorKind::Identity, 1.0, &[]);
    assert!(epsilon.is_some_and(|e| e > 0.0 && e.is_finite()));
    for (kind, rate, options, smaller_than) in [
        (CompressorKind::Qsgd, 1.0, &["levels=4"][..], 7.0),
        (
            CompressorKind::Qsgd,
            1.0,
            &["levels=4", "encoding=elias"][..],
            7.0,
        ),
        (CompressorKind::Terngrad, 1.0, &[][..], 15.0),
        (CompressorKind::Signsgd, 1.0, &[][..], 30.0),
        (CompressorKind::EfSignsgd, 1.0, &[][..], 30.0),
        (CompressorKind::Randomk, 32.0, &[][..], 30.0),
        (CompressorKind::Threshold, 1.0, &["threshold=0.5"][..], 4.0),
        (CompressorKind::Fp16, 1.0, &[][..], 1.99),
        (CompressorKind::Int8, 1.0, &[][..], 3.9),
        (CompressorKind::Natural, 1.0, &[][..], 3.5),
    ] {
        let (e, bits) = run(kind, rate, options);
        assert_eq!(e, epsilon, "{kind} {options:?}: ε");
        assert!(
            bits * smaller_than < dense_bits,
            "{kind} {options:?}: {bits} bits against {dense_bits} dense"
        );
    }
}
