//! The stateless receiver of dense, DGC and PowerSGD messages: every payload back to a dense
//! tensor in its parameter's shape (`Payload::to_dense`: values as sent, sparse values scattered
//! into zeros, P Qᵀ). A model-wise message (DGC with `scope = model`) carries one flat payload
//! for all parameters, which is split into their shapes in order.

use super::codec::{Decoder, Scope};
use super::message::{Message, Payload};
use tch::Tensor;

/// The receiver (`Decoder`) of dense, DGC and PowerSGD messages: stateless, it turns every
/// payload back into a dense tensor of its parameter's shape.
pub struct Unpack {
    /// `Some(shapes)`: the message is one flat payload for parameters of these shapes (in the
    /// encoder's order); `None`: one payload per parameter, already in its shape.
    model_wise: Option<Vec<Vec<i64>>>,
}

impl Unpack {
    /// One payload per parameter.
    pub fn per_parameter() -> Self {
        Unpack { model_wise: None }
    }

    /// The receiver for `scope`: per parameter, or one flat payload split into `shapes`.
    pub fn new(shapes: &[Vec<i64>], scope: Scope) -> Self {
        Unpack {
            model_wise: (scope == Scope::Model).then(|| shapes.to_vec()),
        }
    }
}

impl Decoder for Unpack {
    fn decode(&mut self, message: &Message) -> Vec<Tensor> {
        let Some(shapes) = &self.model_wise else {
            return message.payloads.iter().map(Payload::to_dense).collect();
        };
        let sizes: Vec<i64> = shapes.iter().map(|s| s.iter().product()).collect();
        message.payloads[0]
            .to_dense()
            .split_with_sizes(&sizes, 0)
            .iter()
            .zip(shapes)
            .map(|(t, shape)| t.view(shape.as_slice()))
            .collect()
    }
}
