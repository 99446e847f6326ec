//! Black-box canaries for the one-run audit (`privacy::audit`): canary i is a training example
//! given a wrong label, included in the training split independently with probability ½ (the
//! excluded ones are removed from it). After training each is scored by minus the final model's
//! loss on it: an included canary was fitted, so its loss is lower. The white-box canaries, which
//! the privacy engine's clipping takes in every step, are `privacy::canary`.

use crate::data::Dataset;
use crate::error::{Error, Result};
use crate::models::Model;
use crate::nn::Ctx;
use crate::privacy::canary::{draw_included, CanarySettings};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tch::{Device, Kind, Tensor};

/// Black-box canaries: training examples given a wrong label (module docs).
pub struct InputCanaries {
    /// Whether canary i was put in the training split (each with probability ½, drawn from the
    /// audit's seed), in canary order: what the auditor guesses.
    pub included: Vec<bool>,
    /// The canaries as examples (features, wrong labels), in canary order.
    pub examples: Dataset,
}

impl InputCanaries {
    /// Takes `settings.canaries` random examples of `train` as canaries, each relabelled to a
    /// uniformly drawn wrong class of `classes`; returns the canaries and the training split
    /// with the included canaries (relabelled) and without the excluded ones.
    pub fn carve(
        settings: &CanarySettings,
        train: &Dataset,
        classes: i64,
    ) -> Result<(Self, Dataset)> {
        let m = settings.canaries;
        let n = train.len();
        if m == 0 || m as i64 >= n || classes < 2 {
            return Err(Error::bad_value(
                "canaries",
                format!("{m} from {n} training examples of {classes} classes: expected 0 < canaries < examples and at least 2 classes"),
            ));
        }
        let mut rng = StdRng::seed_from_u64(settings.seed);
        let included = draw_included(&mut rng, m);
        let chosen: Vec<i64> = rand::seq::index::sample(&mut rng, n as usize, m)
            .into_iter()
            .map(|i| i as i64)
            .collect();
        let index = Tensor::from_slice(&chosen);
        let labels = crate::host::to_vec_i64(
            &train
                .labels
                .index_select(0, &index.to_device(train.device()))
                .to_device(Device::Cpu),
        )
        .map_err(|e| Error::bad_value("labels", e.to_string()))?;
        let wrong: Vec<i64> = labels
            .iter()
            .map(|&y| (y + rng.random_range(1..classes)) % classes)
            .collect();
        let cpu = |t: &Tensor| t.to_device(train.device());
        let wrong = Tensor::from_slice(&wrong);
        let examples = Dataset::new(
            train.features.select_trimmed(&cpu(&index), None),
            cpu(&wrong),
            train.image_transform.clone(),
        );
        // Training: every example but the excluded canaries, the included ones relabelled.
        let mut keep = vec![true; n as usize];
        for (&i, &inside) in chosen.iter().zip(&included) {
            keep[i as usize] = inside;
        }
        let kept = Tensor::from_slice(&(0..n).filter(|&i| keep[i as usize]).collect::<Vec<_>>());
        let relabelled = train
            .labels
            .copy()
            .index_put_(&[Some(cpu(&index))], &cpu(&wrong), false);
        let trained = Dataset::new(
            train.features.select_trimmed(&cpu(&kept), None),
            relabelled.index_select(0, &cpu(&kept)),
            train.image_transform.clone(),
        );
        Ok((InputCanaries { included, examples }, trained))
    }

    /// Each canary's score, minus its cross-entropy under `model` (evaluation mode) with its
    /// wrong label: an included canary was fitted, so its loss is lower and its score higher.
    pub fn scores(&self, model: &dyn Model, device: Device) -> Result<Vec<f64>> {
        let n = self.examples.len();
        let mut scores = Vec::with_capacity(n as usize);
        tch::no_grad(|| -> Result<()> {
            let mut start = 0;
            while start < n {
                let len = 256.min(n - start);
                let index = Tensor::arange_start(start, start + len, (Kind::Int64, Device::Cpu));
                let batch = self.examples.batch(&index, device, false);
                let logits = model.forward(&batch.features, &mut Ctx::eval())?;
                let losses = model.example_losses(&logits, &batch.features, &batch.labels);
                let losses =
                    crate::host::to_vec_f64(&losses.to_kind(Kind::Double).to_device(Device::Cpu))
                        .map_err(|e| Error::bad_value("canary losses", e.to_string()))?;
                scores.extend(losses.into_iter().map(|l| -l));
                start += len;
            }
            Ok(())
        })?;
        Ok(scores)
    }
}
