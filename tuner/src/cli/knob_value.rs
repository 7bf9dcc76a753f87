//! A llama.cpp knob's flag as clap parses it: its values listed from the knob table (help and
//! completions), each parsed as the knob's type parses it, aliases included (`-fa 1`).

use clap::builder::{PossibleValue, TypedValueParser};
use search_space::value::ParseKnobError;
use search_space::Knob;
use std::ffi::OsStr;
use std::marker::PhantomData;
use std::str::FromStr;

/// The value parser of `knob`'s flag, yielding a `T`.
pub fn knob_value<T>(knob: &'static dyn Knob) -> KnobValue<T> {
    KnobValue {
        knob,
        value: PhantomData,
    }
}

pub struct KnobValue<T> {
    knob: &'static dyn Knob,
    value: PhantomData<fn() -> T>,
}

impl<T> Clone for KnobValue<T> {
    fn clone(&self) -> Self {
        knob_value(self.knob)
    }
}

impl<T> TypedValueParser for KnobValue<T>
where
    T: FromStr<Err = ParseKnobError> + Clone + Send + Sync + 'static,
{
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let text = value.to_string_lossy();
        text.parse::<T>().map_err(|e| {
            clap::Error::raw(clap::error::ErrorKind::InvalidValue, format!("{e}\n")).with_cmd(cmd)
        })
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        let choices = self.knob.choices();
        if choices.is_empty() {
            return None;
        }
        Some(Box::new(choices.into_iter().map(PossibleValue::new)))
    }
}
