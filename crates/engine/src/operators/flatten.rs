//! The Flatten stage (`beam:transform:flatten:v1`): the union of its inputs.

use timely::dataflow::operators::Concatenate;
use timely::dataflow::Scope;

use super::Elements;
use crate::time::Time;

/// One stream of every element of `inputs`, in no particular order; its
/// watermark is the least of the inputs' (timely's frontier of a union).
pub(crate) fn flatten<'s>(scope: Scope<'s, Time>, inputs: Vec<Elements<'s>>) -> Elements<'s> {
    scope.concatenate(inputs)
}
