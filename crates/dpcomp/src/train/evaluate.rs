//! Test loss and accuracy: of a model on a dataset (`evaluate`), and of a data-parallel run, whose
//! workers each evaluate a share and add their sums.

use super::{distributed, Trainer};
use crate::data::Dataset;
use crate::error::Result;
use crate::models::Model;
use crate::nn::Ctx;
use tch::{Device, Kind, Tensor};

/// Loss (mean cross-entropy) and accuracy of `model` on `data`, in evaluation mode.
pub fn evaluate(
    model: &dyn Model,
    data: &Dataset,
    batch_size: usize,
    device: Device,
) -> Result<(f64, f64)> {
    let n = data.len();
    if n == 0 {
        return Ok((f64::NAN, f64::NAN));
    }
    let all = Tensor::arange(n, (Kind::Int64, Device::Cpu));
    let (loss_sum, correct) = evaluation_sums(model, data, &all, batch_size, device)?;
    Ok((loss_sum / n as f64, correct / n as f64))
}

/// Summed cross-entropy and correct predictions of `model` on the examples `index` (CPU int64)
/// of `data`, in evaluation mode, in batches of `batch_size`: `evaluate`'s sums, and each
/// worker's share of them in a data-parallel run.
pub fn evaluation_sums(
    model: &dyn Model,
    data: &Dataset,
    index: &Tensor,
    batch_size: usize,
    device: Device,
) -> Result<(f64, f64)> {
    let n = index.size()[0];
    tch::no_grad(|| {
        let mut loss_sum = Tensor::zeros([], (Kind::Double, device));
        let mut correct = Tensor::zeros([], (Kind::Double, device));
        let mut start = 0;
        while start < n {
            let len = (batch_size as i64).min(n - start);
            let batch = data.batch(&index.narrow(0, start, len), device, false);
            let logits = model.forward(&batch.features, &mut Ctx::eval())?;
            loss_sum += model
                .mean_loss(&logits, &batch.features, &batch.labels)
                .to_kind(Kind::Double)
                * len as f64;
            correct += model.correct(&logits, &batch.features, &batch.labels);
            start += len;
        }
        Ok((
            crate::host::f64_scalar(&loss_sum),
            crate::host::f64_scalar(&correct),
        ))
    })
}

impl Trainer {
    /// Test loss and accuracy. With W workers each evaluates the test examples i ≡ rank
    /// (mod W) and their sums are added (the weights are the same on every rank).
    pub(super) fn evaluate_on_workers(&mut self) -> Result<(f64, f64)> {
        let (rank, workers) = (self.rank(), self.workers());
        let Some(exchange) = self.updater.exchange.as_mut() else {
            return evaluate(
                self.model.as_ref(),
                &self.data.test,
                self.config.data.eval_batch_size,
                self.device,
            );
        };
        let n = self.data.test.len();
        if n == 0 {
            return Ok((f64::NAN, f64::NAN));
        }
        let mine =
            Tensor::arange_start_step(rank as i64, n, workers as i64, (Kind::Int64, Device::Cpu));
        let (loss_sum, correct) = evaluation_sums(
            self.model.as_ref(),
            &self.data.test,
            &mine,
            self.config.data.eval_batch_size,
            self.device,
        )?;
        let sums = distributed::sum_over_workers(exchange.comm.as_mut(), &[loss_sum, correct])?;
        Ok((sums[0] / n as f64, sums[1] / n as f64))
    }
}
