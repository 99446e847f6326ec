//! A weight table used twice in one forward pass: as a token lookup (an embedding) and as the
//! output head, logits = h · Wᵀ (a language model whose `lm_head` is tied to its token table:
//! GPT-2, and Llama with `tie_word_embeddings`). When the table trains, each example's gradient
//! is the sum of both uses, and the tape must give it as one recipe: the head's record hands its
//! input and output gradient to the lookup's (the backward pass reaches the head first), which
//! forms the table's per-sample gradients, their norms without instantiating them
//! (`TiedGradient`).

use super::embedding::EmbeddingRecord;
use super::input::kernel_error;
use super::per_sample::{outer, Activations, PerSample, PerSampleGradient};
use super::{Ctx, LayerGradients, Recorded};
use crate::error::Result;
use std::sync::{Arc, Mutex};
use tch::{Kind, Tensor};

/// One forward pass's link between the two uses of a tied table: make one per private forward
/// pass, use `lookup` for the token embedding and `head` for the logits.
pub struct TiedTable {
    link: TiedLink,
}

impl Default for TiedTable {
    fn default() -> Self {
        TiedTable {
            link: Arc::new(Mutex::new(None)),
        }
    }
}

impl TiedTable {
    /// The rows of `weight` [vocabulary, width] that `ids` (integer, [B, T]) name, recorded as
    /// the table's first use where the tape is on.
    pub fn lookup(&self, weight: &Tensor, ids: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let layer = || format!("tied token table {:?}", weight.size());
        let ys = Tensor::f_embedding(weight, ids, -1, false, false)
            .map_err(|e| kernel_error(&layer(), e))?;
        if let Some(tape) = ctx.tape() {
            let record = TiedEmbeddingRecord {
                lookup: EmbeddingRecord {
                    weight: weight.shallow_clone(),
                    ids: ids.shallow_clone(),
                },
                head: self.link.clone(),
            };
            tape.push(record, &ys);
        }
        Ok(ys)
    }

    /// hidden [B, T, width] · `weight`ᵀ, the logits [B, T, vocabulary], recorded as the table's
    /// second use where the tape is on.
    pub fn head(&self, weight: &Tensor, hidden: &Tensor, ctx: &mut Ctx) -> Tensor {
        let logits = hidden.linear::<Tensor>(weight, None);
        if let Some(tape) = ctx.tape() {
            let record = TiedHeadRecord {
                input: hidden.detach(),
                link: self.link.clone(),
            };
            tape.push(record, &logits);
        }
        logits
    }
}

/// Where a language model's head hands its record to the token lookup's: (the hidden states
/// [B, T, n_embd], the logits' gradient [B, T, vocab]), set in the backward pass, which reaches
/// the head before the lookup.
type TiedLink = Arc<Mutex<Option<(Tensor, Tensor)>>>;

/// The head's use of the tied table, logits = h · wteᵀ: it leaves its inputs and output
/// gradient to the lookup's record, which gives the table's one recipe.
struct TiedHeadRecord {
    input: Tensor,
    link: TiedLink,
}

impl Recorded for TiedHeadRecord {
    fn per_sample(&self, output_grad: &Tensor) -> LayerGradients {
        let mut link = self.link.lock().unwrap_or_else(|p| p.into_inner());
        *link = Some((self.input.shallow_clone(), output_grad.shallow_clone()));
        LayerGradients::of(Vec::new())
    }
}

/// The token lookup of a tied table: its recipe is the sum of the lookup's rows and the head's
/// outer products (`TiedGradient`).
struct TiedEmbeddingRecord {
    lookup: EmbeddingRecord,
    head: TiedLink,
}

impl Recorded for TiedEmbeddingRecord {
    fn per_sample(&self, output_grad: &Tensor) -> LayerGradients {
        let mut lookup = self.lookup.per_sample(output_grad);
        let head = self.head.lock().unwrap_or_else(|p| p.into_inner()).take();
        let (Some((weight, rows)), Some((hidden, logits_grad))) = (lookup.parameters.pop(), head)
        else {
            return lookup;
        };
        let batch = output_grad.size()[0];
        let (vocab, width) = (weight.size()[0], weight.size()[1]);
        let hidden = hidden.reshape([batch, -1, width]);
        let logits_grad = logits_grad.reshape([batch, -1, vocab]);
        let gradient = TiedGradient {
            ids: self.lookup.ids.reshape([batch, -1]).to_kind(Kind::Int64),
            lookup_grad: output_grad.reshape([batch, -1, width]),
            hidden: hidden.shallow_clone(),
            logits_grad: logits_grad.shallow_clone(),
            lookup: rows,
            head: outer(Activations::Held(hidden), logits_grad, vec![vocab, width]),
        };
        LayerGradients::of(vec![(weight, PerSample::Custom(Box::new(gradient)))])
    }
}

/// Per-sample gradients of a table used twice, g_i = E_i + H_i with E_i = Σ_t e_{ids_it} b_itᵀ
/// (the lookup) and H_i = Σ_s g_is h_isᵀ (the head); ||g_i||² = ||E_i||² + ||H_i||² +
/// 2 Σ_{t,s} g_is\[ids_it\] ⟨b_it, h_is⟩, without forming g_i.
struct TiedGradient {
    ids: Tensor,
    lookup_grad: Tensor,
    hidden: Tensor,
    logits_grad: Tensor,
    lookup: PerSample,
    head: PerSample,
}

impl PerSampleGradient for TiedGradient {
    fn squared_norms(&self) -> Tensor {
        let (batch, steps) = (self.logits_grad.size()[0], self.logits_grad.size()[1]);
        let looked_up = self.ids.size()[1];
        // at[i, s, t] = g_is[ids_it]; inner[i, s, t] = ⟨h_is, b_it⟩.
        let index = self
            .ids
            .view([batch, 1, looked_up])
            .expand([batch, steps, looked_up], false);
        let at = self.logits_grad.gather(2, &index, false);
        let inner = self.hidden.bmm(&self.lookup_grad.transpose(1, 2));
        let cross = (at * inner).sum_dim_intlist(&[1i64, 2][..], false, None::<Kind>);
        let norms = self.lookup.squared_norms() + self.head.squared_norms();
        &norms + cross.to_kind(norms.kind()) * 2.0
    }

    fn weighted_sum(&self, c: &Tensor) -> Tensor {
        // The lookup's rows go into the head's sum in place: one [vocabulary, width] buffer
        // rather than three.
        let mut sum = self.head.weighted_sum(c);
        self.lookup.add_weighted_sum_to(c, &mut sum);
        sum
    }

    fn materialize(&self) -> Tensor {
        self.lookup.materialize() + self.head.materialize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn the_tied_norms_equal_the_norms_of_the_summed_gradients() {
        tch::manual_seed(1);
        let (batch, steps, vocab, width) = (3, 5, 7, 4);
        let opts = (Kind::Double, Device::Cpu);
        let ids = Tensor::randint(vocab, [batch, steps], (Kind::Int64, Device::Cpu));
        let lookup_grad = Tensor::randn([batch, steps, width], opts);
        let hidden = Tensor::randn([batch, steps, width], opts);
        let logits_grad = Tensor::randn([batch, steps, vocab], opts);
        let gradient = TiedGradient {
            ids: ids.shallow_clone(),
            lookup_grad: lookup_grad.shallow_clone(),
            hidden: hidden.shallow_clone(),
            logits_grad: logits_grad.shallow_clone(),
            lookup: PerSample::Rows {
                ids,
                b: lookup_grad,
                rows: vocab,
            },
            head: outer(Activations::Held(hidden), logits_grad, vec![vocab, width]),
        };
        let g = gradient.materialize();
        assert_eq!(g.size(), [batch, vocab, width]);
        let direct = g
            .square()
            .sum_dim_intlist(&[1i64, 2][..], false, Kind::Double);
        let diff = crate::host::f64_scalar(&(gradient.squared_norms() - &direct).abs().max());
        assert!(
            diff < 1e-9 * crate::host::f64_scalar(&direct.max()),
            "{diff:e}"
        );
        let c = Tensor::from_slice(&[0.5f64, -2.0, 1.0]);
        let want = (&g * c.view([batch, 1, 1])).sum_dim_intlist(0, false, Kind::Double);
        let diff = crate::host::f64_scalar(&(gradient.weighted_sum(&c) - want).abs().max());
        assert!(diff < 1e-9, "{diff:e}");
    }
}
