//! A private training of one's own through dpcomp's lean core: a linear classifier on seeded
//! synthetic data, DP-SGD at a target ε with DGC compression, from the prelude only. It exits
//! with an error unless the accuracy, ε and message size are what they must be.
use dpcomp::prelude::*;
use tch::{nn, Device, Kind, Reduction, Tensor};

fn main() -> Result<()> {
    tch::manual_seed(0);
    // Two Gaussian classes in 8 dimensions, means ±0.5 apart along every axis.
    let (n, dim) = (2_000i64, 8i64);
    let y = Tensor::randint(2, [n], (Kind::Int64, Device::Cpu));
    let x = Tensor::randn([n, dim], (Kind::Float, Device::Cpu))
        + (y.to_kind(Kind::Float) - 0.5).unsqueeze(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let linear = Linear::new(&(vs.root() / "linear"), dim, 2, LinearConfig::default())?;
    let params: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();

    let (target, epochs) = (2.0, 3);
    let mut engine = PrivacyEngine::builder()
        .target_epsilon(target)
        .delta(1e-5)
        .epochs(epochs)
        .dataset_size(n as u64)
        .expected_batch_size(100.0)
        .max_grad_norm(1.0)
        .build(&params)?;
    let dgc = Compressor::Dgc(Dgc {
        rate: 4.0,
        warmup_epochs: 0,
        ..Default::default()
    });
    let mut updater = Updater::with_compressor(Sgd::new(0.5, 0.0), &dgc, &tensors)?;
    let mut bits = 0;
    for epoch in 0..epochs as usize {
        for index in poisson_batches(n, engine.sample_rate(), (n as usize).div_ceil(100)) {
            let mut ctx = Ctx::private();
            let logits = linear.forward(&x.index_select(0, &index), &mut ctx)?;
            let loss = logits.cross_entropy_loss::<Tensor>(
                &y.index_select(0, &index),
                None,
                Reduction::Sum,
                -100,
                0.0,
            );
            let per_sample = per_sample_of(&mut ctx, &params, &loss)?;
            let grads = engine.privatize(&engine.clip(&per_sample))?;
            bits = updater.apply(epoch, &tensors, &grads)?;
        }
    }
    let logits = tch::no_grad(|| linear.forward(&x, &mut Ctx::eval()))?;
    let accuracy = logits
        .argmax(-1, false)
        .eq_tensor(&y)
        .to_kind(Kind::Double)
        .mean(Kind::Double)
        .double_value(&[]);
    let epsilon = engine.epsilon()?;
    println!(
        "dependent crate: accuracy {:.1}%, ε {epsilon:.3} (target {target}), σ {:.3}, last message {bits} bits",
        100.0 * accuracy,
        engine.noise_multiplier()
    );
    // The Bayes accuracy of these classes is Φ(√8 / 2) ≈ 92%.
    let checks = [
        (accuracy >= 0.85, format!("accuracy {accuracy:.3} < 0.85")),
        (
            epsilon <= target && epsilon > 0.95 * target,
            format!("ε {epsilon} not in (0.95, 1] x {target}"),
        ),
        (
            bits > 0 && bits < 18 * 32,
            format!("{bits} bits for 18 parameters at rate 4"),
        ),
    ];
    for (ok, what) in checks {
        if !ok {
            return Err(Error::bad_value("dependent crate", what));
        }
    }
    Ok(())
}
