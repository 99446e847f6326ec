//! A federated run of a model of one's own on clients' data of one's own: the tiny GPT-2 fixture
//! with LoRA on `c_attn` learns arithmetic progressions over 10 clients under client-level DP,
//! with FL-RND compressing the adapters' updates; its bytes and ε are checked like any run's,
//! and the frozen base weights come back untouched.

use crate::common;
use dpcomp::compress::linear_sketch::Scheme;
use dpcomp::compress::{Compressor, Message, Payload};
use dpcomp::config::CompressionSettings;
use dpcomp::data::{Dataset, Features};
use dpcomp::fl::data::FlDataset;
use dpcomp::fl::{FederatedRun, FlPrivacy, FlSettings};
use dpcomp::hf::{FineTuning, Gpt2, Head};
use dpcomp::models::Model;
use dpcomp::nn::LoraConfig;
use dpcomp::prelude::AccountantKind;
use std::collections::HashMap;
use tch::{Device, Kind, Tensor};

/// Longest sequence.
const MAX_LEN: i64 = 10;
/// The sequences use token ids 1..=CYCLE.
const CYCLE: i64 = 12;

/// `n` right-padded sequences (padding 0) of 5..=10 tokens, each the progression of step 1
/// through the ids 1..=12 from a random start, wrapping around: learnable from any position.
fn progressions(n: i64, seed: u64) -> Dataset {
    use rand::Rng;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
    let mut ids = Vec::with_capacity((n * MAX_LEN) as usize);
    let mut lengths = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let length = rng.random_range(5..=MAX_LEN);
        let start = rng.random_range(0..CYCLE);
        for t in 0..MAX_LEN {
            ids.push(if t < length {
                1 + (start + t) % CYCLE
            } else {
                0
            });
        }
        lengths.push(length);
    }
    Dataset::new(
        Features::Tokens {
            ids: Tensor::from_slice(&ids).view([n, MAX_LEN]),
            lengths: Tensor::from_slice(&lengths),
        },
        Tensor::zeros([n], (Kind::Int64, Device::Cpu)),
        None,
    )
}

/// Every variable by name, copied.
fn weights(model: &dyn Model) -> HashMap<String, Tensor> {
    model
        .var_store()
        .variables()
        .into_iter()
        .map(|(name, t)| (name, t.detach().copy()))
        .collect()
}

#[test]
fn private_federated_lora_of_gpt2_learns_sends_fl_rnd_bytes_and_keeps_the_base_frozen() {
    let _serial = common::serial();
    tch::manual_seed(7);
    let model = Gpt2::from_pretrained(
        &common::hf_fixtures().join("gpt2"),
        Device::Cpu,
        Head::CausalLm,
        &FineTuning::Lora(LoraConfig {
            rank: 2,
            alpha: 4.0,
            dropout: 0.0,
            target_modules: vec!["c_attn".into()],
        }),
    )
    .unwrap();
    let n = model.trainable_parameter_count();
    let trainable: Vec<String> = model
        .trainable_variables()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert!(
        trainable.iter().all(|name| name.contains("lora")),
        "{trainable:?}"
    );
    let before = weights(&model);

    let clients: Vec<Dataset> = (0..10).map(|k| progressions(24, 100 + k)).collect();
    let rate = 4.0;
    let (sigma, clip, delta, fraction, rounds) = (0.3, 0.5, 1e-3, 0.5, 15);
    let mut settings = FlSettings::defaults(FlDataset::BreastCancer);
    settings.clients = 10;
    settings.fraction = fraction;
    settings.rounds = rounds;
    settings.local.steps = 6;
    settings.local.batch = 8;
    settings.local.learning_rate = 1.0;
    settings.compression = CompressionSettings::new(Compressor::sketch(Scheme::Rnd, rate));
    settings.privacy = Some(FlPrivacy {
        clip,
        noise_multiplier: sigma,
        delta,
        accountant: AccountantKind::Pld,
    });
    let outcome = FederatedRun::builder()
        .settings(settings)
        .model(Box::new(model))
        .clients(clients, progressions(64, 1))
        .build()
        .unwrap()
        .run()
        .unwrap();
    let rows = &outcome.rounds;
    let summary = outcome.summary.as_ref().unwrap();
    assert_eq!(rows.len(), rounds);
    assert_eq!(summary.dataset, "own");
    assert_eq!(summary.metric, "accuracy");

    // (a) The adapters learn the progressions: next-token accuracy and test loss improve.
    let (first, last) = (&rows[0], &rows[rounds - 1]);
    eprintln!(
        "n {n}: accuracy {:.3} -> {:.3}, loss {:.3} -> {:.3}",
        first.accuracy, last.accuracy, first.test_loss, last.test_loss
    );
    assert!(last.accuracy > first.accuracy + 0.1, "{first:?} {last:?}");
    assert!(last.test_loss < first.test_loss - 1.0, "{first:?} {last:?}");

    // (b) FL-RND at rate 4 keeps m = round(n / 4) coordinates of the adapters' vector; every
    // sampled client sends one message of m float32 values in the wire format.
    let m = (n as f64 / rate).round() as i64;
    assert_eq!(summary.parameters, n);
    assert_eq!(summary.message_length, m);
    let one = Message::new(vec![Payload::Dense {
        values: Tensor::zeros([m], (Kind::Float, Device::Cpu)),
        value_bits: 32,
    }]);
    let bytes = dpcomp::compress::wire::encoded_len(&one) as u64;
    assert!(bytes > 4 * m as u64 && bytes < 4 * m as u64 + 64, "{bytes}");
    assert!(rows.iter().any(|r| r.clients > 0));
    for row in rows {
        assert_eq!(row.upstream_bits, 8 * bytes * row.clients as u64, "{row:?}");
    }

    // (c) ε is the accountant's for q = C = 0.5, σ and one step per round, computed beside.
    for row in rows {
        let expected =
            dpcomp::privacy::pld::epsilon(fraction, sigma, row.round as u64, delta).unwrap();
        assert_eq!(row.epsilon, Some(expected), "round {}", row.round);
    }

    // (d) Only the adapters changed: the base weights are bit-identical after the run.
    let model = outcome.model.expect("the model of one's own comes back");
    let after = weights(model.as_ref());
    assert_eq!(after.len(), before.len());
    let mut changed = 0;
    for (name, t) in &before {
        let equal = t.equal(&after[name]);
        if trainable.contains(name) {
            changed += usize::from(!equal);
        } else {
            assert!(equal, "frozen {name} changed");
        }
    }
    assert_eq!(changed, trainable.len(), "every adapter trained");
}

#[test]
fn a_model_of_ones_own_is_refused_without_its_data_or_with_a_folder() {
    let _serial = common::serial();
    let model = || -> Box<dyn Model> {
        Box::new(
            Gpt2::from_pretrained(
                &common::hf_fixtures().join("gpt2"),
                Device::Cpu,
                Head::CausalLm,
                &FineTuning::Lora(LoraConfig {
                    rank: 2,
                    alpha: 4.0,
                    dropout: 0.0,
                    target_modules: vec!["c_attn".into()],
                }),
            )
            .unwrap(),
        )
    };
    let mut settings = FlSettings::defaults(FlDataset::BreastCancer);
    settings.clients = 3;
    let shards = || (0..3).map(|k| progressions(4, k)).collect::<Vec<_>>();
    let error = |builder: dpcomp::fl::FederatedRunBuilder| match builder.build() {
        Ok(_) => panic!("built"),
        Err(e) => e.to_string(),
    };
    let message = error(
        FederatedRun::builder()
            .settings(settings.clone())
            .model(model()),
    );
    assert!(message.contains("clients"), "{message}");
    let message = error(
        FederatedRun::builder()
            .settings(settings.clone())
            .clients(shards(), progressions(4, 9)),
    );
    assert!(message.contains("model"), "{message}");
    let dir = tempfile::tempdir().unwrap();
    let message = error(
        FederatedRun::builder()
            .settings(settings.clone())
            .model(model())
            .clients(shards(), progressions(4, 9))
            .out(dir.path()),
    );
    assert!(
        message.contains("out") && message.contains("folder"),
        "{message}"
    );
    let mut two = shards();
    two.truncate(2);
    let message = error(
        FederatedRun::builder()
            .settings(settings.clone())
            .model(model())
            .clients(two, progressions(4, 9)),
    );
    assert!(
        message.contains("2 client datasets") && message.contains("3"),
        "{message}"
    );
    let mut empty = shards();
    empty[1] = progressions(0, 1);
    let message = error(
        FederatedRun::builder()
            .settings(settings)
            .model(model())
            .clients(empty, progressions(4, 9)),
    );
    assert!(message.contains("client 1"), "{message}");
}
