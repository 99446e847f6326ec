//! One-layer LSTM written from linear cells (Hochreiter & Schmidhuber; PyTorch's gate order
//! i, f, g, o and its two bias vectors), instead of a fused cuDNN/oneDNN kernel, so that the
//! per-sample gradients of `w_ih`, `w_hh` and the biases can be formed from recorded inputs and
//! gate gradients (issue 3).
//!
//! The input projection x_t W_ih^T + b_ih + b_hh is computed for all time steps in one matrix
//! product; only the recurrent product h_{t-1} W_hh^T runs step by step.

use super::{uniform_init, Ctx};
use tch::{nn, Tensor};

#[derive(Debug)]
pub struct Lstm {
    pub w_ih: Tensor,
    pub w_hh: Tensor,
    pub b_ih: Tensor,
    pub b_hh: Tensor,
    pub hidden: i64,
}

impl Lstm {
    /// U(-1/sqrt(hidden), 1/sqrt(hidden)) for every parameter, PyTorch's `nn.LSTM` default.
    pub fn new(p: &nn::Path, input: i64, hidden: i64) -> Self {
        let init = uniform_init(hidden);
        Lstm {
            w_ih: p.var("w_ih", &[4 * hidden, input], init),
            w_hh: p.var("w_hh", &[4 * hidden, hidden], init),
            b_ih: p.var("b_ih", &[4 * hidden], init),
            b_hh: p.var("b_hh", &[4 * hidden], init),
            hidden,
        }
    }

    /// xs: [B, T, input] (batch first). Returns every hidden state, [B, T, hidden].
    /// Zero initial state. Steps past an example's length are computed but never read by the
    /// models (they take the state at the last real step), so padding cannot leak into them.
    pub fn forward(&self, xs: &Tensor, _ctx: &mut Ctx) -> Tensor {
        let (batch, steps) = (xs.size()[0], xs.size()[1]);
        let bias = &self.b_ih + &self.b_hh;
        let x_proj = xs.linear(&self.w_ih, Some(&bias)); // [B, T, 4H]
        let mut h = Tensor::zeros([batch, self.hidden], (xs.kind(), xs.device()));
        let mut c = Tensor::zeros([batch, self.hidden], (xs.kind(), xs.device()));
        let mut outputs = Vec::with_capacity(steps as usize);
        for t in 0..steps {
            let gates = x_proj.select(1, t).addmm(&h, &self.w_hh.tr());
            let chunks = gates.chunk(4, 1);
            let (i, f, g, o) = (
                chunks[0].sigmoid(),
                chunks[1].sigmoid(),
                chunks[2].tanh(),
                chunks[3].sigmoid(),
            );
            c = f * &c + i * g;
            h = o * c.tanh();
            outputs.push(h.shallow_clone());
        }
        Tensor::stack(&outputs, 1)
    }
}
