//! Where a response's cost is read, as configuration writes it: [`CostFrom`], its parsing from
//! `header:NAME` or `json:PATH` text, and its display. It is apart from the meter because it is
//! read once, when the configuration loads; the meter runs on every response.

use std::fmt;
use std::str::FromStr;

use http::HeaderName;

use super::{DEFAULT_MAX, JsonPath, MAX_KEY_LEN, MAX_PATH_KEYS};
use crate::ConfigError;

/// Where a response's cost is read, parsed from configuration text:
///
/// - `header:NAME`: a response header holding a decimal integer, such as
///   `header:x-usage-tokens`.
/// - `json:PATH`: a path of object keys joined by dots into a JSON body or into the events of
///   an event stream, such as `json:usage.total_tokens` (OpenAI's chat completions, and their
///   streams with `stream_options.include_usage`). 1 to [`MAX_PATH_KEYS`] keys, each non-empty
///   and at most [`MAX_KEY_LEN`] bytes, matched exactly (case and Unicode included).
///
/// **Array indices are not supported**: `choices[0].x` and `choices.0.x` are refused, and so is
/// any key made only of digits, which would read as one. A key cannot contain a dot.
///
/// `Display` gives the text back (header names in lower case), and parsing it again gives an
/// equal value. Cloning is cheap (the path is shared).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CostFrom {
    pub(super) source: Source,
    pub(super) max: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Source {
    Header(HeaderName),
    Json(JsonPath),
}

const EXPECTED: &str = "write `header:NAME` (a response header, such as `header:x-usage-tokens`) \
     or `json:PATH` (object keys joined by dots, such as `json:usage.total_tokens`)";

impl FromStr for CostFrom {
    type Err = ConfigError;

    fn from_str(input: &str) -> Result<Self, ConfigError> {
        let text = input.trim();
        let Some((kind, arg)) = text.split_once(':') else {
            return Err(ConfigError::new(input, EXPECTED));
        };
        let source = match kind.trim() {
            "header" => {
                let name = arg.trim();
                if name.is_empty() {
                    return Err(ConfigError::new(
                        input,
                        "the header name is missing: write `header:NAME`, such as \
                         `header:x-usage-tokens`",
                    ));
                }
                let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                    ConfigError::new(
                        input,
                        "not a valid HTTP header name: write `header:NAME` with a name such as \
                         `x-usage-tokens`",
                    )
                })?;
                Source::Header(name)
            }
            "json" => Source::Json(parse_path(input, arg.trim())?),
            _ => return Err(ConfigError::new(input, EXPECTED)),
        };
        Ok(CostFrom {
            source,
            max: DEFAULT_MAX,
        })
    }
}

fn parse_path(input: &str, text: &str) -> Result<JsonPath, ConfigError> {
    if text.is_empty() {
        return Err(ConfigError::new(
            input,
            "the JSON path is missing: write the object keys joined by dots, such as \
             `json:usage.total_tokens`",
        ));
    }
    let count = text.split('.').count();
    if count > MAX_PATH_KEYS {
        return Err(ConfigError::new(
            input,
            format!("the path has {count} keys; at most {MAX_PATH_KEYS} are supported"),
        ));
    }
    let mut keys = Vec::with_capacity(count);
    for key in text.split('.') {
        if key.is_empty() {
            return Err(ConfigError::new(
                input,
                "a key of the path is empty: write the object keys joined by single dots, such \
                 as `json:usage.total_tokens` (a key cannot contain a dot)",
            ));
        }
        if key.contains(['[', ']']) || key.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ConfigError::new(
                input,
                format!(
                    "array indices are not supported (`{}`): the cost must be at a path of \
                     object keys, such as `json:usage.total_tokens`; for an API that reports it \
                     inside an array, read it from a header (`header:NAME`)",
                    // The key is echoed to say which; never more than a few words of it.
                    key.chars().take(40).collect::<String>()
                ),
            ));
        }
        if key.trim() != key {
            return Err(ConfigError::new(
                input,
                "a key of the path starts or ends with whitespace; keys are matched exactly: \
                 remove the spaces, as in `json:usage.total_tokens`",
            ));
        }
        if key.len() > MAX_KEY_LEN {
            return Err(ConfigError::new(
                input,
                format!("a key of the path is longer than {MAX_KEY_LEN} bytes"),
            ));
        }
        keys.push(Box::from(key));
    }
    Ok(JsonPath(keys.into()))
}

impl fmt::Display for CostFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Source::Header(name) => write!(f, "header:{name}"),
            Source::Json(path) => {
                f.write_str("json:")?;
                for (i, key) in path.0.iter().enumerate() {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(key)?;
                }
                Ok(())
            }
        }
    }
}

impl CostFrom {
    /// The same source, with `max` as the largest cost reported as [`Usage::Found`]; larger
    /// figures are [`BadReason::TooLarge`]. The default is [`DEFAULT_MAX`].
    ///
    /// [`Usage::Found`]: super::Usage::Found
    /// [`BadReason::TooLarge`]: super::BadReason::TooLarge
    #[must_use]
    pub fn with_max(mut self, max: u64) -> Self {
        self.max = max;
        self
    }

    /// The largest cost reported as [`Usage::Found`].
    ///
    /// [`Usage::Found`]: super::Usage::Found
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The response header read, for `header:NAME`.
    pub fn header(&self) -> Option<&HeaderName> {
        match &self.source {
            Source::Header(name) => Some(name),
            Source::Json(_) => None,
        }
    }

    /// The keys of the path, outermost first, for `json:PATH`.
    pub fn json_keys(&self) -> Option<impl ExactSizeIterator<Item = &str>> {
        match &self.source {
            Source::Header(_) => None,
            Source::Json(path) => Some(path.0.iter().map(|key| &**key)),
        }
    }
}
