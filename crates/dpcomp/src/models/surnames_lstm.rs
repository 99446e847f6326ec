//! Surnames: Embedding(256, 64) -> one-layer LSTM(64 -> 128) reading the hidden state at the last
//! real time step of each name -> Linear(128, 18). 118,034 parameters.

use super::{check_range, check_token_shape, wrong_features, Model};
use crate::data::names::VOCAB;
use crate::data::Features;
use crate::error::Result;
use crate::nn::{Ctx, Embedding, Linear, LinearConfig, Lstm};
use tch::{nn, Device, Kind, Tensor};

/// Width of the byte embeddings.
const EMBEDDING: i64 = 64;
/// Width of the LSTM's hidden state.
const HIDDEN: i64 = 128;

/// The paper's Surnames classifier (see the module docs): padded byte sequences
/// (`Features::Tokens`, ids [B, T] below 256 and lengths `[B]`) -> logits [B, classes].
pub struct SurnamesLstm {
    vs: nn::VarStore,
    embedding: Embedding,
    lstm: Lstm,
    classifier: Linear,
}

impl SurnamesLstm {
    /// A freshly initialised model (PyTorch's default initialisations) on `device` for
    /// `classes` classes (118,034 parameters for the 18 nationalities).
    ///
    /// # Errors
    ///
    /// [`Error::BadValue`](crate::error::Error::BadValue) when `classes` is below 1 (the
    /// classifier's `Linear out_dim`).
    pub fn new(device: Device, classes: i64) -> Result<Self> {
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let embedding = Embedding::new(&(&root / "embedding"), VOCAB, EMBEDDING)?;
        let lstm = Lstm::new(&(&root / "lstm"), EMBEDDING, HIDDEN)?;
        let classifier = Linear::new(
            &(&root / "classifier"),
            HIDDEN,
            classes,
            LinearConfig::default(),
        )?;
        Ok(SurnamesLstm {
            vs,
            embedding,
            lstm,
            classifier,
        })
    }
}

impl Model for SurnamesLstm {
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> Result<Tensor> {
        let Features::Tokens { ids, lengths } = features else {
            return Err(wrong_features("SurnamesLstm", "token sequences", features));
        };
        check_token_shape("SurnamesLstm", ids, lengths)?;
        let hs = self.lstm.forward(&self.embedding.forward(ids, ctx)?, ctx)?; // [B, T, H]
                                                                              // Hidden state at index length-1 of each example.
        let last = (lengths - 1)
            .clamp_min(0)
            .to_kind(Kind::Int64)
            .view([-1, 1, 1]);
        let last = hs
            .gather(1, &last.expand([-1, 1, HIDDEN], false), false)
            .squeeze_dim(1);
        self.classifier.forward(&last, ctx)
    }

    /// Byte ids below the embedding's 256 rows; every length from 1 to the padded width.
    fn check_features(&self, features: &Features) -> Result<()> {
        let Features::Tokens { ids, lengths } = features else {
            return Err(wrong_features("SurnamesLstm", "token sequences", features));
        };
        check_token_shape("SurnamesLstm", ids, lengths)?;
        check_range("SurnamesLstm", "token ids", ids, 0, VOCAB)?;
        check_range("SurnamesLstm", "lengths", lengths, 1, ids.size()[1] + 1)
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }
}
