//! The LSTM's hand-written backpropagation through time against autograd through the same
//! recurrence, in f64.

use crate::common;
use dpcomp::data::Features;
use dpcomp::models::{Model, SurnamesLstm};
use dpcomp::nn::Ctx;
use tch::{Device, Kind, Tensor};

fn grads(model: &SurnamesLstm) -> Vec<(String, Tensor)> {
    model
        .trainable_variables()
        .into_iter()
        .map(|(n, p)| (n, p.grad().copy()))
        .collect()
}

fn zero(model: &SurnamesLstm) {
    for (_, p) in model.trainable_variables() {
        p.shallow_clone().zero_grad();
    }
}

#[test]
fn manual_bptt_equals_autograd_for_every_parameter() {
    let _serial = common::serial();
    tch::manual_seed(21);
    let model = SurnamesLstm::new(Device::Cpu, 18).unwrap();
    common::to_double(model.var_store());
    let ids = Tensor::randint_low(1, 256, [5, 9], (Kind::Int64, Device::Cpu));
    let lengths = Tensor::from_slice(&[9i64, 1, 4, 7, 9]);
    let labels = Tensor::from_slice(&[3i64, 0, 17, 5, 5]);
    let features = Features::Tokens { ids, lengths };

    // Oracle: evaluation mode runs the recurrence as plain autograd code.
    let mut eval = Ctx::eval();
    let loss = model
        .forward(&features, &mut eval)
        .unwrap()
        .cross_entropy_loss::<Tensor>(&labels, None, tch::Reduction::Mean, -100, 0.0);
    loss.backward();
    let expected = grads(&model);
    zero(&model);

    // Training mode: no-autograd recurrence + hand-written backward (dropout is not used here).
    let mut train = Ctx::train();
    let loss_train = model
        .forward(&features, &mut train)
        .unwrap()
        .cross_entropy_loss::<Tensor>(&labels, None, tch::Reduction::Mean, -100, 0.0);
    assert!((loss_train.double_value(&[]) - loss.double_value(&[])).abs() < 1e-12);
    train.backward(&loss_train);
    let got = grads(&model);
    assert_eq!(expected.len(), got.len());
    for ((name, e), (_, g)) in expected.iter().zip(&got) {
        let scale = e.abs().max().double_value(&[]).max(1e-12);
        let diff = (e - g).abs().max().double_value(&[]);
        assert!(
            diff / scale < 1e-10,
            "{name}: relative difference {}",
            diff / scale
        );
        assert!(scale > 1e-8, "{name} got no gradient at all");
    }
}

#[test]
fn manual_bptt_accumulates_like_autograd() {
    let _serial = common::serial();
    // Two backward passes without zeroing add up, as `.backward()` does.
    tch::manual_seed(4);
    let model = SurnamesLstm::new(Device::Cpu, 18).unwrap();
    common::to_double(model.var_store());
    let features = Features::Tokens {
        ids: Tensor::randint_low(1, 256, [3, 4], (Kind::Int64, Device::Cpu)),
        lengths: Tensor::from_slice(&[4i64, 2, 3]),
    };
    let labels = Tensor::from_slice(&[1i64, 2, 3]);
    let mut once = Ctx::train();
    let loss = model
        .forward(&features, &mut once)
        .unwrap()
        .cross_entropy_loss::<Tensor>(&labels, None, tch::Reduction::Mean, -100, 0.0);
    once.backward(&loss);
    let single = grads(&model);
    let mut twice = Ctx::train();
    let loss = model
        .forward(&features, &mut twice)
        .unwrap()
        .cross_entropy_loss::<Tensor>(&labels, None, tch::Reduction::Mean, -100, 0.0);
    twice.backward(&loss);
    for ((name, s), (_, d)) in single.iter().zip(&grads(&model)) {
        let diff = (s * 2.0 - d).abs().max().double_value(&[]);
        assert!(diff < 1e-12, "{name}: {diff}");
    }
}
