//! One-layer LSTM written from linear cells (Hochreiter & Schmidhuber; PyTorch's gate order
//! i, f, g, o and its two bias vectors), instead of a fused cuDNN/oneDNN kernel, so that the
//! per-sample gradients of `w_ih`, `w_hh` and the biases can be formed from recorded inputs and
//! gate gradients.
//!
//! The input projection x_t W_ih^T + b_ih + b_hh is computed for all time steps in one matrix
//! product; only the recurrent product h_{t-1} W_hh^T runs step by step.
//!
//! In training, backpropagation through time is written out by hand (`LstmBackward`): autograd
//! would create about ten nodes per time step, and their bookkeeping costs more than the
//! arithmetic at these sizes. The hand-written backward walks the steps once with a handful of
//! fused tensor operations each and then forms every weight gradient as one contraction over all
//! time steps. `tests/layers/lstm.rs` checks it against autograd through `forward_autograd`.

use super::input::{at_least, expect_dim};
use super::per_sample::{outer, Activations, PerSample};
use super::recurrent::{hand_to_autograd, shift_in_zero, stack_steps};
use super::tape::{LayerGradients, Recorded};
use super::{uniform_init, Ctx, ManualBackward};
use crate::error::Result;
use tch::{nn, Tensor};

/// A one-layer, batch-first LSTM with PyTorch's `nn.LSTM` parameters and gate order
/// (i, f, g, o), whose per-sample gradients come from its hand-written backward pass.
#[derive(Debug)]
pub struct Lstm {
    /// Input weights of the 4 gates stacked (i, f, g, o), [4H, input].
    pub w_ih: Tensor,
    /// Recurrent weights of the 4 gates stacked, [4H, H].
    pub w_hh: Tensor,
    /// Input bias, `[4H]`.
    pub b_ih: Tensor,
    /// Recurrent bias, `[4H]`.
    pub b_hh: Tensor,
    /// H, the width of the hidden state.
    pub hidden: i64,
}

/// What the hand-written backward needs from the forward pass, all time-major [T, B, ...].
pub struct LstmCache {
    /// Inputs x_t, [T, B, in].
    pub xs: Tensor,
    /// Hidden states h_t, [T, B, H].
    pub hs: Tensor,
    /// Cell states c_t, [T, B, H].
    pub cs: Tensor,
    /// Sigmoid of all four gate pre-activations, [T, B, 4H] (the g slot is not used).
    pub sig: Tensor,
    /// g = tanh of the g pre-activation, [T, B, H].
    pub g: Tensor,
    /// tanh(c_t), [T, B, H].
    pub tanh_c: Tensor,
}

impl LstmCache {
    /// h_{t-1} for every step, [T, B, H] (h_{-1} = 0).
    pub fn h_prev(&self) -> Tensor {
        shift_in_zero(&self.hs)
    }
}

impl Lstm {
    /// A one-layer LSTM from `input` features to a hidden state of width `hidden` under
    /// `p`, U(-1/sqrt(hidden), 1/sqrt(hidden)) for every parameter, PyTorch's `nn.LSTM` default.
    ///
    /// # Errors
    ///
    /// [`Error::BadValue`](crate::error::Error::BadValue) naming the argument (`Lstm hidden:
    /// 0, expected at least 1`) when `input` or `hidden` is below 1.
    pub fn new(p: &nn::Path, input: i64, hidden: i64) -> Result<Self> {
        at_least("Lstm", [("input", input, 1), ("hidden", hidden, 1)])?;
        let init = uniform_init(hidden);
        Ok(Lstm {
            w_ih: p.var("w_ih", &[4 * hidden, input], init),
            w_hh: p.var("w_hh", &[4 * hidden, hidden], init),
            b_ih: p.var("b_ih", &[4 * hidden], init),
            b_hh: p.var("b_hh", &[4 * hidden], init),
            hidden,
        })
    }

    /// xs: [B, T, input] (batch first). Returns every hidden state, [B, T, hidden], from a zero
    /// initial state. Steps past an example's length are computed but never read by the models
    /// (they take the state at the last real step), so padding cannot leak into them.
    ///
    /// In training (`ctx.records()`) the recurrence runs without autograd and records an
    /// `LstmBackward` segment; in private training it records a tape entry instead (the
    /// per-sample engine differentiates it); otherwise it is ordinary autograd code.
    pub fn forward(&self, xs: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let input = self.w_ih.size()[1];
        let layer = || format!("Lstm({input} -> {})", self.hidden);
        expect_dim(xs, 3..=3, 2, input, layer, || {
            format!("[batch, steps, {input}] (batch first)")
        })?;
        let private = ctx.tape().is_some() && self.w_ih.requires_grad();
        if !ctx.records() && !private {
            return Ok(self.forward_autograd(xs));
        }
        let (hs, cache) = tch::no_grad(|| self.forward_cached(&xs.detach()));
        let hs = hs.set_requires_grad(true);
        if let Some(tape) = ctx.tape().filter(|_| private) {
            let record = LstmRecord {
                w_ih: self.w_ih.shallow_clone(),
                w_hh: self.w_hh.shallow_clone(),
                b_ih: self.b_ih.shallow_clone(),
                b_hh: self.b_hh.shallow_clone(),
                cache,
                input: xs.shallow_clone(),
            };
            tape.push(record, &hs);
            return Ok(hs);
        }
        ctx.push(Box::new(LstmBackward {
            w_ih: self.w_ih.shallow_clone(),
            w_hh: self.w_hh.shallow_clone(),
            b_ih: self.b_ih.shallow_clone(),
            b_hh: self.b_hh.shallow_clone(),
            input: xs.shallow_clone(),
            output: hs.shallow_clone(),
            cache,
        }));
        Ok(hs)
    }

    /// One time step: gates a = x_proj_t + h W_hh^T; i, f, o = sigmoid, g = tanh;
    /// c' = f c + i g; h' = o tanh(c'). Returns (h', c', sigmoid(a), g, tanh(c')).
    fn cell(&self, x_proj_t: &Tensor, h: &Tensor, c: &Tensor, w_hh_t: &Tensor) -> [Tensor; 5] {
        let hidden = self.hidden;
        let gates = x_proj_t.addmm(h, w_hh_t);
        // One sigmoid over all four gates (the g slot is unused) costs less than three calls.
        let sig = gates.sigmoid();
        let g = gates.narrow(1, 2 * hidden, hidden).tanh();
        let i = sig.narrow(1, 0, hidden);
        let f = sig.narrow(1, hidden, hidden);
        let o = sig.narrow(1, 3 * hidden, hidden);
        let c_next = (f * c).addcmul(&i, &g);
        let tanh_c = c_next.tanh();
        let h_next = o * &tanh_c;
        [h_next, c_next, sig, g, tanh_c]
    }

    /// x_t W_ih^T + b_ih + b_hh for all steps, time-major [T, B, 4H] (a transposed view).
    fn x_projection(&self, xs: &Tensor) -> Tensor {
        let bias = &self.b_ih + &self.b_hh;
        xs.linear(&self.w_ih, Some(&bias)).transpose(0, 1)
    }

    /// Runs the recurrence from a zero state; per step: (h', c', sigmoid(a), g, tanh(c')).
    fn steps(&self, xs: &Tensor) -> Vec<[Tensor; 5]> {
        let (batch, steps) = (xs.size()[0], xs.size()[1]);
        let x_proj = self.x_projection(xs);
        let w_hh_t = self.w_hh.tr();
        let opts = (xs.kind(), xs.device());
        let mut h = Tensor::zeros([batch, self.hidden], opts);
        let mut c = Tensor::zeros([batch, self.hidden], opts);
        let mut out = Vec::with_capacity(steps as usize);
        for t in 0..steps {
            let step = self.cell(&x_proj.get(t), &h, &c, &w_hh_t);
            (h, c) = (step[0].shallow_clone(), step[1].shallow_clone());
            out.push(step);
        }
        out
    }

    /// The recurrence as plain autograd code (evaluation, and the oracle in tests).
    pub fn forward_autograd(&self, xs: &Tensor) -> Tensor {
        let hs: Vec<Tensor> = self.steps(xs).into_iter().map(|[h, ..]| h).collect();
        Tensor::stack(&hs, 1)
    }

    /// The recurrence, keeping what `LstmBackward` needs. Call without autograd. Returns the
    /// hidden states batch-first [B, T, H] (a transposed view of the cache's `hs`).
    pub fn forward_cached(&self, xs: &Tensor) -> (Tensor, LstmCache) {
        let steps = self.steps(xs);
        let stack = |k: usize| stack_steps(&steps, k);
        let cache = LstmCache {
            xs: xs.transpose(0, 1).contiguous(),
            hs: stack(0),
            cs: stack(1),
            sig: stack(2),
            g: stack(3),
            tanh_c: stack(4),
        };
        (cache.hs.transpose(0, 1), cache)
    }
}

/// Gradients of the gate pre-activations, [T, B, 4H], given dL/dh_t for every step
/// (`grad_hs`, [B, T, H]): backpropagation through time, last step first.
///
/// With tc = tanh(c_t): dh = dL/dh_t + dh_{t+1 -> t}; dc = dc_{t+1 -> t} + dh o (1 - tc^2);
/// da = [dc, dc, dc, dh] * [i'(a) g, f'(a) c_{t-1}, g'(a) i, o'(a) tc] with s'(a) = s(1 - s),
/// tanh'(a) = 1 - g^2; then dh_{t -> t-1} = da W_hh and dc_{t -> t-1} = dc f. Everything that
/// does not depend on the incoming gradient is computed for all steps at once first.
pub(crate) fn gate_gradients(cache: &LstmCache, w_hh: &Tensor, grad_hs: &Tensor) -> Tensor {
    let steps = cache.hs.size()[0];
    let hidden = cache.hs.size()[2];
    let gate = |k: i64| cache.sig.narrow(2, k * hidden, hidden);
    let (i, f, o, g) = (gate(0), gate(1), gate(3), &cache.g);
    let slope = |s: &Tensor| s - s.square(); // sigmoid'(a) = s (1 - s)
    let c_prev = shift_in_zero(&cache.cs);
    let factors = Tensor::cat(
        &[
            slope(&i) * g,
            slope(&f) * c_prev,
            (g.square().neg() + 1.0) * &i,
            slope(&o) * &cache.tanh_c,
        ],
        2,
    );
    let dc_from_dh = o * (cache.tanh_c.square().neg() + 1.0);
    let grad_hs = grad_hs.transpose(0, 1);
    let mut da = Vec::with_capacity(steps as usize);
    let mut carry: Option<(Tensor, Tensor)> = None; // (dh, dc) flowing from step t+1 into t
    for t in (0..steps).rev() {
        let (dh, dc) = match carry {
            Some((dh_next, dc_next)) => {
                let dh = grad_hs.get(t) + dh_next;
                let dc = dc_next.addcmul(&dh, &dc_from_dh.get(t));
                (dh, dc)
            }
            None => {
                let dh = grad_hs.get(t);
                let dc = &dh * dc_from_dh.get(t);
                (dh, dc)
            }
        };
        let da_t = Tensor::cat(&[&dc, &dc, &dc, &dh], 1) * factors.get(t);
        carry = Some((da_t.mm(w_hh), dc * f.get(t)));
        da.push(da_t);
    }
    da.reverse();
    Tensor::stack(&da, 0)
}

/// The hand-written backward of one LSTM forward in training.
struct LstmBackward {
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Tensor,
    b_hh: Tensor,
    input: Tensor,
    output: Tensor,
    cache: LstmCache,
}

impl ManualBackward for LstmBackward {
    fn backward(&self) {
        let grad_hs = self.output.grad();
        if !grad_hs.defined() {
            return; // the output did not influence the loss
        }
        let (d_w_ih, d_w_hh, d_b, d_input) = tch::no_grad(|| {
            let da = gate_gradients(&self.cache, &self.w_hh, &grad_hs); // [T, B, 4H]
            let four_h = da.size()[2];
            let da_flat = da.view([-1, four_h]);
            let x = &self.cache.xs;
            let d_w_ih = da_flat.tr().mm(&x.view([-1, x.size()[2]]));
            let h_prev = self.cache.h_prev();
            let d_w_hh = da_flat.tr().mm(&h_prev.view([-1, h_prev.size()[2]]));
            let d_b = da_flat.sum_dim_intlist(0, false, da.kind());
            let d_input = da.matmul(&self.w_ih).transpose(0, 1); // [B, T, in]
            (d_w_ih, d_w_hh, d_b, d_input)
        });
        hand_to_autograd(
            &[
                (&self.w_ih, &d_w_ih),
                (&self.w_hh, &d_w_hh),
                (&self.b_ih, &d_b),
                (&self.b_hh, &d_b),
            ],
            &self.input,
            &d_input,
        );
    }
}

/// The LSTM on the tape. Its output is an autograd leaf (the recurrence ran without autograd),
/// so its per-sample gradients come from the hand-written gate gradients, and the gradient of
/// its input is handed back to the engine as `LayerGradients::upstream`.
pub(crate) struct LstmRecord {
    pub w_ih: Tensor,
    pub w_hh: Tensor,
    pub b_ih: Tensor,
    pub b_hh: Tensor,
    pub cache: LstmCache,
    /// The input as the graph before the LSTM produced it (to carry gradients back).
    pub input: Tensor,
}

impl Recorded for LstmRecord {
    /// With da_t the gate pre-activations' gradients (backpropagation through time from the
    /// output gradient): g_i(W_ih) = Σ_t da_it x_itᵀ, g_i(W_hh) = Σ_t da_it h_i,t-1ᵀ,
    /// g_i(b_ih) = g_i(b_hh) = Σ_t da_it.
    fn per_sample(&self, grad: &Tensor) -> LayerGradients {
        let da = tch::no_grad(|| gate_gradients(&self.cache, &self.w_hh, grad)); // [T, B, 4H]
        let da_b = da.transpose(0, 1); // [B, T, 4H]
        let bias_grad = da_b.sum_dim_intlist(1, false, da.kind());
        let parameters = vec![
            (
                self.b_ih.shallow_clone(),
                PerSample::Direct(bias_grad.shallow_clone()),
            ),
            (self.b_hh.shallow_clone(), PerSample::Direct(bias_grad)),
            (
                self.w_ih.shallow_clone(),
                outer(
                    Activations::Held(self.cache.xs.transpose(0, 1)),
                    da_b.shallow_clone(),
                    self.w_ih.size(),
                ),
            ),
            (
                self.w_hh.shallow_clone(),
                outer(
                    Activations::Held(self.cache.h_prev().transpose(0, 1)),
                    da_b,
                    self.w_hh.size(),
                ),
            ),
        ];
        let upstream = self.input.requires_grad().then(|| {
            let d_input = tch::no_grad(|| da.matmul(&self.w_ih).transpose(0, 1));
            (&self.input * d_input).sum(self.input.kind())
        });
        LayerGradients {
            parameters,
            upstream,
        }
    }
}
