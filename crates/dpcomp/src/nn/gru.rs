//! One-layer GRU written from linear cells (Cho et al. 2014, with PyTorch's `nn.GRU` equations:
//! gate order r, z, n and the reset gate applied to the recurrent projection *after* its bias),
//! so that the per-sample gradients of `w_ih`, `w_hh` and both biases come from recorded inputs
//! and gate gradients, as the LSTM's do (`lstm.rs`).
//!
//! Per step, with gi = x_t W_ihᵀ + b_ih and gh = h W_hhᵀ + b_hh split into (r, z, n) thirds:
//! r = σ(gi_r + gh_r), z = σ(gi_z + gh_z), n = tanh(gi_n + r ⊙ gh_n), h' = (1 - z) ⊙ n + z ⊙ h.
//! The input projection runs for all steps in one matrix product; only h W_hhᵀ runs per step.
//!
//! In training and private training the recurrence runs without autograd and backpropagation
//! through time is written by hand (`gate_gradients`): every gate gradient is dh_t times a factor
//! known from the forward pass, so the backward loop is one multiply and one matrix product per
//! step. `tests/layers/layers_tests.rs` checks it against autograd and the forward pass against PyTorch's GRU.

use super::input::{at_least, expect_dim};
use super::per_sample::{outer, Activations, PerSample};
use super::recurrent::{hand_to_autograd, shift_in_zero, stack_steps};
use super::tape::{LayerGradients, Recorded};
use super::{uniform_init, Ctx, ManualBackward};
use crate::error::Result;
use tch::{nn, Tensor};

/// A one-layer, batch-first GRU with PyTorch's `nn.GRU` parameters and gate order
/// (r, z, n), whose per-sample gradients come from its hand-written backward pass.
#[derive(Debug)]
pub struct Gru {
    /// Input weights of the 3 gates stacked (r, z, n), [3H, input].
    pub w_ih: Tensor,
    /// Recurrent weights of the 3 gates stacked, [3H, H].
    pub w_hh: Tensor,
    /// Input bias, `[3H]`.
    pub b_ih: Tensor,
    /// Recurrent bias, `[3H]`.
    pub b_hh: Tensor,
    /// H, the width of the hidden state.
    pub hidden: i64,
}

/// What the hand-written backward needs from the forward pass, all time-major [T, B, ...].
pub struct GruCache {
    /// Inputs x_t, [T, B, in].
    pub xs: Tensor,
    /// Hidden states h_t, [T, B, H].
    pub hs: Tensor,
    /// r and z, [T, B, 2H].
    pub rz: Tensor,
    /// n, [T, B, H].
    pub n: Tensor,
    /// The recurrent projection's n third before the reset gate, h W_hnᵀ + b_hn, [T, B, H].
    pub gh_n: Tensor,
}

impl GruCache {
    /// h_{t-1} for every step, [T, B, H] (h_{-1} = 0).
    pub fn h_prev(&self) -> Tensor {
        shift_in_zero(&self.hs)
    }
}

impl Gru {
    /// A one-layer GRU from `input` features to a hidden state of width `hidden` under
    /// `p`, U(-1/sqrt(hidden), 1/sqrt(hidden)) for every parameter, PyTorch's `nn.GRU` default.
    ///
    /// # Errors
    ///
    /// [`Error::BadValue`](crate::error::Error::BadValue) naming the argument (`Gru hidden:
    /// 0, expected at least 1`) when `input` or `hidden` is below 1.
    pub fn new(p: &nn::Path, input: i64, hidden: i64) -> Result<Self> {
        at_least("Gru", [("input", input, 1), ("hidden", hidden, 1)])?;
        let init = uniform_init(hidden);
        Ok(Gru {
            w_ih: p.var("w_ih", &[3 * hidden, input], init),
            w_hh: p.var("w_hh", &[3 * hidden, hidden], init),
            b_ih: p.var("b_ih", &[3 * hidden], init),
            b_hh: p.var("b_hh", &[3 * hidden], init),
            hidden,
        })
    }

    /// xs: [B, T, input] (batch first). Returns every hidden state, [B, T, hidden], from a zero
    /// initial state (as `Lstm::forward`: steps past an example's length are computed, and a
    /// model reads the state at its last real step).
    pub fn forward(&self, xs: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let input = self.w_ih.size()[1];
        let layer = || format!("Gru({input} -> {})", self.hidden);
        expect_dim(xs, 3..=3, 2, input, layer, || {
            format!("[batch, steps, {input}] (batch first)")
        })?;
        let private = ctx.tape().is_some() && self.w_ih.requires_grad();
        if !ctx.records() && !private {
            return Ok(self.forward_autograd(xs));
        }
        let (hs, cache) = tch::no_grad(|| self.forward_cached(&xs.detach()));
        let hs = hs.set_requires_grad(true);
        let record = GruRecord {
            w_ih: self.w_ih.shallow_clone(),
            w_hh: self.w_hh.shallow_clone(),
            b_ih: self.b_ih.shallow_clone(),
            b_hh: self.b_hh.shallow_clone(),
            cache,
            input: xs.shallow_clone(),
        };
        match ctx.tape().filter(|_| private) {
            Some(tape) => tape.push(record, &hs),
            None => ctx.push(Box::new(GruBackward {
                record,
                output: hs.shallow_clone(),
            })),
        }
        Ok(hs)
    }

    /// One step; returns (h', r and z, n, gh_n).
    fn cell(&self, gi_t: &Tensor, h: &Tensor) -> [Tensor; 4] {
        let hidden = self.hidden;
        let gh = h.linear(&self.w_hh, Some(&self.b_hh));
        let rz = (gi_t.narrow(1, 0, 2 * hidden) + gh.narrow(1, 0, 2 * hidden)).sigmoid();
        let r = rz.narrow(1, 0, hidden);
        let z = rz.narrow(1, hidden, hidden);
        let gh_n = gh.narrow(1, 2 * hidden, hidden);
        let n = gi_t.narrow(1, 2 * hidden, hidden).addcmul(&r, &gh_n).tanh();
        let h_next = &n + z * (h - &n);
        [h_next, rz, n, gh_n]
    }

    /// Runs the recurrence from a zero state; per step (h', r and z, n, gh_n).
    fn steps(&self, xs: &Tensor) -> Vec<[Tensor; 4]> {
        let (batch, steps) = (xs.size()[0], xs.size()[1]);
        let gi = xs.linear(&self.w_ih, Some(&self.b_ih)).transpose(0, 1); // [T, B, 3H]
        let mut h = Tensor::zeros([batch, self.hidden], (xs.kind(), xs.device()));
        let mut out = Vec::with_capacity(steps as usize);
        for t in 0..steps {
            let step = self.cell(&gi.get(t), &h);
            h = step[0].shallow_clone();
            out.push(step);
        }
        out
    }

    /// The recurrence as plain autograd code (evaluation, and the oracle in tests).
    pub fn forward_autograd(&self, xs: &Tensor) -> Tensor {
        let hs: Vec<Tensor> = self.steps(xs).into_iter().map(|[h, ..]| h).collect();
        Tensor::stack(&hs, 1)
    }

    /// The recurrence, keeping what the hand-written backward needs. Call without autograd.
    /// Returns the hidden states batch-first [B, T, H] (a transposed view of the cache's `hs`).
    pub fn forward_cached(&self, xs: &Tensor) -> (Tensor, GruCache) {
        let steps = self.steps(xs);
        let stack = |k: usize| stack_steps(&steps, k);
        let cache = GruCache {
            xs: xs.transpose(0, 1).contiguous(),
            hs: stack(0),
            rz: stack(1),
            n: stack(2),
            gh_n: stack(3),
        };
        (cache.hs.transpose(0, 1), cache)
    }
}

/// Gradients of the input and recurrent projections, (d gi, d gh), each [T, B, 3H], given
/// dL/dh_t for every step (`grad_hs`, [B, T, H]): backpropagation through time, last step first.
///
/// With dh the total gradient of h_t and a = (1 - z)(1 - n²) (the gradient of n's
/// pre-activation per unit dh): d gi_n = dh a, d gh_n = dh a r, d gi_r = d gh_r =
/// dh a gh_n r(1 - r), d gi_z = d gh_z = dh (h_{t-1} - n) z(1 - z). So each is dh times a factor
/// computed for all steps at once; the loop carries dh_{t-1} += dh z + d gh W_hh.
pub(crate) fn gate_gradients(
    cache: &GruCache,
    w_hh: &Tensor,
    grad_hs: &Tensor,
) -> (Tensor, Tensor) {
    let steps = cache.hs.size()[0];
    let hidden = cache.hs.size()[2];
    let r = cache.rz.narrow(2, 0, hidden);
    let z = cache.rz.narrow(2, hidden, hidden);
    let slope = |s: &Tensor| s - s.square(); // σ'(a) = σ (1 - σ)
    let a = (z.neg() + 1.0) * (cache.n.square().neg() + 1.0);
    let reset = &a * &cache.gh_n * slope(&r);
    let update = (cache.h_prev() - &cache.n) * slope(&z);
    let hidden_factors = Tensor::cat(&[&reset, &update, &(&a * &r)], 2);
    let input_factors = Tensor::cat(&[reset, update, a], 2);
    let grad_hs = grad_hs.transpose(0, 1);
    let mut dhs = Vec::with_capacity(steps as usize);
    let mut carry: Option<Tensor> = None; // dL/dh_t flowing back from step t+1
    for t in (0..steps).rev() {
        let dh = match carry {
            Some(c) => grad_hs.get(t) + c,
            None => grad_hs.get(t).shallow_clone(),
        };
        let d_gh = Tensor::cat(&[&dh, &dh, &dh], 1) * hidden_factors.get(t);
        carry = Some((&dh * z.get(t)).addmm(&d_gh, w_hh));
        dhs.push(dh);
    }
    dhs.reverse();
    let dhs = Tensor::stack(&dhs, 0);
    let dh3 = Tensor::cat(&[&dhs, &dhs, &dhs], 2);
    (&dh3 * input_factors, dh3 * hidden_factors)
}

/// The GRU on the tape: its output is an autograd leaf (the recurrence ran without autograd),
/// so its per-sample gradients come from `gate_gradients`, and the gradient of its input goes
/// back to the engine as `LayerGradients::upstream`.
pub(crate) struct GruRecord {
    pub w_ih: Tensor,
    pub w_hh: Tensor,
    pub b_ih: Tensor,
    pub b_hh: Tensor,
    pub cache: GruCache,
    /// The input as the graph before the GRU produced it (to carry gradients back).
    pub input: Tensor,
}

impl Recorded for GruRecord {
    /// g_i(W_ih) = Σ_t d gi_it x_itᵀ, g_i(W_hh) = Σ_t d gh_it h_i,t-1ᵀ, g_i(b_ih) = Σ_t d gi_it,
    /// g_i(b_hh) = Σ_t d gh_it.
    fn per_sample(&self, grad: &Tensor) -> LayerGradients {
        let (d_gi, d_gh) = tch::no_grad(|| gate_gradients(&self.cache, &self.w_hh, grad));
        let (gi_b, gh_b) = (d_gi.transpose(0, 1), d_gh.transpose(0, 1)); // [B, T, 3H]
        let kind = d_gi.kind();
        let parameters = vec![
            (
                self.b_ih.shallow_clone(),
                PerSample::Direct(gi_b.sum_dim_intlist(1, false, kind)),
            ),
            (
                self.b_hh.shallow_clone(),
                PerSample::Direct(gh_b.sum_dim_intlist(1, false, kind)),
            ),
            (
                self.w_ih.shallow_clone(),
                outer(
                    Activations::Held(self.cache.xs.transpose(0, 1)),
                    gi_b,
                    self.w_ih.size(),
                ),
            ),
            (
                self.w_hh.shallow_clone(),
                outer(
                    Activations::Held(self.cache.h_prev().transpose(0, 1)),
                    gh_b,
                    self.w_hh.size(),
                ),
            ),
        ];
        let upstream = self.input.requires_grad().then(|| {
            let d_input = tch::no_grad(|| d_gi.matmul(&self.w_ih).transpose(0, 1));
            (&self.input * d_input).sum(self.input.kind())
        });
        LayerGradients {
            parameters,
            upstream,
        }
    }
}

/// The hand-written backward of one GRU forward in non-private training.
struct GruBackward {
    record: GruRecord,
    output: Tensor,
}

impl ManualBackward for GruBackward {
    fn backward(&self) {
        let grad_hs = self.output.grad();
        if !grad_hs.defined() {
            return; // the output did not influence the loss
        }
        let g = &self.record;
        let (d_w_ih, d_w_hh, d_b_ih, d_b_hh, d_input) = tch::no_grad(|| {
            let (d_gi, d_gh) = gate_gradients(&g.cache, &g.w_hh, &grad_hs); // [T, B, 3H]
            let three_h = d_gi.size()[2];
            let (gi_flat, gh_flat) = (d_gi.view([-1, three_h]), d_gh.view([-1, three_h]));
            let x = &g.cache.xs;
            let h_prev = g.cache.h_prev();
            (
                gi_flat.tr().mm(&x.view([-1, x.size()[2]])),
                gh_flat.tr().mm(&h_prev.view([-1, h_prev.size()[2]])),
                gi_flat.sum_dim_intlist(0, false, d_gi.kind()),
                gh_flat.sum_dim_intlist(0, false, d_gh.kind()),
                d_gi.matmul(&g.w_ih).transpose(0, 1), // [B, T, in]
            )
        });
        hand_to_autograd(
            &[
                (&g.w_ih, &d_w_ih),
                (&g.w_hh, &d_w_hh),
                (&g.b_ih, &d_b_ih),
                (&g.b_hh, &d_b_hh),
            ],
            &g.input,
            &d_input,
        );
    }
}
