//! The rule a line of a limits file belongs to, read from the text alone: a file the parser
//! rejects (a syntax error, a string where a number belongs) still reports its error against a
//! rule, like every other config error, instead of a rule that does not exist.
//!
//! Why from the text: a parser error leaves no tree to ask. Block-style YAML, the way
//! envoyproxy/ratelimit's files are written, says by indentation which `descriptors` item a line
//! is in; each enclosing item's `key` and `value` give its segment of the rule path, as the
//! validator names it (`key`, or `key_value`, joined by `.`). A line outside every descriptor
//! (or one indentation cannot place, inside a flow collection spanning lines) belongs to the
//! file: rule `domain`, as every file-level problem. The line number itself is the parser's
//! and exact either way.

use super::error::DOMAIN_RULE;

/// One open mapping key or sequence item on the way down to the line looked for.
enum Frame {
    Key {
        indent: usize,
        name: String,
    },
    /// An item of a `descriptors` list: the line index of its `-`.
    Descriptor {
        indent: usize,
        start: usize,
    },
    /// An item of any other list (`rate_limits`, `replaces`).
    Item {
        indent: usize,
    },
}

impl Frame {
    fn indent(&self) -> usize {
        match self {
            Frame::Key { indent, .. }
            | Frame::Descriptor { indent, .. }
            | Frame::Item { indent } => *indent,
        }
    }
}

/// The rule path of the descriptor that 1-based `line` of `text` is in, `domain` when none.
pub(crate) fn rule_at(text: &str, line: Option<usize>) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let Some(target) = line
        .and_then(|l| l.checked_sub(1))
        .filter(|&t| t < lines.len())
    else {
        return DOMAIN_RULE.to_string();
    };
    let mut stack: Vec<Frame> = Vec::new();
    for (index, raw) in lines.iter().enumerate().take(target + 1) {
        let Some((indent, content)) = significant(raw) else {
            continue;
        };
        let item = content == "-" || content.starts_with("- ");
        // A list may sit at its key's own indentation (`descriptors:` then `- key: a` below
        // it, both at column 0): an item closes deeper frames and earlier items at its
        // indentation, never the key that holds the list.
        stack.retain_while_last(|f| {
            if item {
                f.indent() < indent || matches!(f, Frame::Key { indent: i, .. } if *i == indent)
            } else {
                f.indent() < indent
            }
        });
        if item {
            let parent_is_descriptors =
                matches!(stack.last(), Some(Frame::Key { name, .. }) if name == "descriptors");
            stack.push(if parent_is_descriptors {
                Frame::Descriptor {
                    indent,
                    start: index,
                }
            } else {
                Frame::Item { indent }
            });
            // `- key: a`: the item's first key sits after the dash.
            let rest = content[1..].trim_start();
            if let Some(name) = key_of(rest) {
                stack.push(Frame::Key {
                    indent: indent + (content.len() - rest.len()),
                    name,
                });
            }
        } else if let Some(name) = key_of(content) {
            stack.push(Frame::Key { indent, name });
        }
    }
    let segments: Vec<String> = stack
        .iter()
        .filter_map(|f| match f {
            Frame::Descriptor { indent, start } => Some(segment(&lines, *start, *indent)),
            _ => None,
        })
        .collect();
    if segments.is_empty() {
        DOMAIN_RULE.to_string()
    } else {
        segments.join(".")
    }
}

/// A descriptor item's segment from its `key` and `value` fields, wherever they are in the
/// item: `key_value`, `key`, or `(no key)` as the validator names them.
fn segment(lines: &[&str], start: usize, dash_indent: usize) -> String {
    let mut key = None;
    let mut value = None;
    let mut field_indent = None;
    for (index, raw) in lines.iter().enumerate().skip(start) {
        let Some((indent, mut content)) = significant(raw) else {
            continue;
        };
        if index == start {
            let rest = content[1..].trim_start();
            field_indent = Some(indent + (content.len() - rest.len()));
            content = rest;
        } else if indent <= dash_indent {
            break;
        } else if field_indent.is_none() {
            field_indent = Some(indent);
        }
        if Some(indent) != field_indent && index != start {
            continue;
        }
        if let Some((name, scalar)) = content.split_once(':') {
            match name.trim() {
                "key" => key = Some(scalar_of(scalar)),
                "value" => value = Some(scalar_of(scalar)),
                _ => {}
            }
        }
    }
    match (
        key.filter(|k| !k.is_empty()),
        value.filter(|v| !v.is_empty()),
    ) {
        (Some(k), Some(v)) => format!("{k}_{v}"),
        (Some(k), None) => k,
        (None, _) => "(no key)".to_string(),
    }
}

/// (indentation, content) of a line that is neither blank nor only a comment.
fn significant(line: &str) -> Option<(usize, &str)> {
    let content = line.trim_start_matches(' ').trim_end();
    if content.is_empty() || content.starts_with('#') {
        return None;
    }
    Some((line.len() - line.trim_start_matches(' ').len(), content))
}

/// The key of a `key: ...` (or `key:`) line, unquoted.
fn key_of(content: &str) -> Option<String> {
    let (name, _) = content.split_once(':')?;
    let name = name.trim().trim_matches(|c| c == '"' || c == '\'');
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    plain.then(|| name.to_string())
}

/// A plain or quoted scalar, its trailing comment removed.
fn scalar_of(text: &str) -> String {
    let text = text.trim();
    let text = match text.find(" #") {
        Some(at) if !text.starts_with(['"', '\'']) => &text[..at],
        _ => text,
    };
    text.trim()
        .trim_matches(|c| c == '"' || c == '\'')
        .to_string()
}

trait RetainWhileLast<T> {
    /// Pops the last element while `keep` is false for it.
    fn retain_while_last(&mut self, keep: impl Fn(&T) -> bool);
}

impl<T> RetainWhileLast<T> for Vec<T> {
    fn retain_while_last(&mut self, keep: impl Fn(&T) -> bool) {
        while self.last().is_some_and(|last| !keep(last)) {
            self.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::rule_at;

    const NESTED: &str = "\
domain: edge
descriptors:
  - key: generic_key
    value: demo
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: tier            # nested
    value: premium
    descriptors:
      - key: user
        rate_limit:
          unit: minute
          requests_per_unit: 1000
          replaces:
            - name: other
  - value: orphan
    rate_limit: {unit: second, requests_per_unit: 1}
";

    #[test]
    fn each_line_names_the_descriptor_it_is_in() {
        let at = |line| rule_at(NESTED, Some(line));
        assert_eq!(at(1), "domain");
        assert_eq!(at(2), "domain");
        assert_eq!(at(3), "generic_key_demo");
        assert_eq!(at(5), "generic_key_demo");
        // The value comes on the line after the key, and after a comment.
        assert_eq!(at(6), "tier_premium");
        assert_eq!(at(8), "tier_premium");
        assert_eq!(at(9), "tier_premium.user");
        assert_eq!(at(12), "tier_premium.user");
        // An item of another list (`replaces`) stays inside its descriptor.
        assert_eq!(at(14), "tier_premium.user");
        assert_eq!(at(15), "(no key)");
        assert_eq!(at(16), "(no key)");
    }

    #[test]
    fn a_list_at_its_keys_own_indentation_is_followed() {
        let text = "domain: d\ndescriptors:\n- key: a\n  descriptors:\n  - key: b\n    value: x\n- key: c\n";
        assert_eq!(rule_at(text, Some(3)), "a");
        assert_eq!(rule_at(text, Some(6)), "a.b_x");
        assert_eq!(rule_at(text, Some(7)), "c");
    }

    #[test]
    fn outside_every_descriptor_or_without_a_line_it_is_the_file() {
        assert_eq!(rule_at(NESTED, None), "domain");
        assert_eq!(rule_at(NESTED, Some(0)), "domain");
        assert_eq!(rule_at(NESTED, Some(99)), "domain");
        assert_eq!(rule_at("domain: [\n", Some(1)), "domain");
    }
}
