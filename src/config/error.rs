//! Config errors: one per problem, each naming the file, the line and the rule it concerns.
//!
//! Why a list and not the first error: an operator fixing a ConfigMap should see every problem
//! in one pass, and a CI check of a config directory should print them all.

use std::fmt;
use std::path::PathBuf;

/// Rule name of file-level problems (the domain, the root mapping, a file the parser rejects
/// outside every descriptor).
pub(crate) const DOMAIN_RULE: &str = "domain";

/// One problem of a config source. Displays as `FILE:LINE: RULE: MESSAGE` (`FILE: RULE: MESSAGE`
/// when the line is unknown).
///
/// `rule` is the config path of the descriptor concerned (`client.path`, `database_users`), or
/// `domain` for file-level problems and `config` for problems of the source itself (unreadable
/// path, empty directory). A file the parser rejects names the descriptor its failing line is
/// in, read from the indentation (`domain` outside every descriptor): see `locate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub rule: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(
        file: impl Into<PathBuf>,
        line: Option<usize>,
        rule: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ConfigError {
            file: file.into(),
            line,
            rule: rule.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, "{line}:")?;
        }
        write!(f, " {}: {}", self.rule, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Every problem found while loading a config, in file order then line order. Never empty when
/// returned by the loader. Displays one error per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    pub fn iter(&self) -> std::slice::Iter<'_, ConfigError> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}
