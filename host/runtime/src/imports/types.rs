//! `stephost:step/types`: only types, no functions.

use crate::bindings::stephost::step::types::Host;
use crate::imports::StepState;

impl Host for StepState {}
