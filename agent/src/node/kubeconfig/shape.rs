//! The shape check run on every YAML document certrotor reads (kubeconfigs, static-pod
//! manifests) before the YAML parser sees it: bounded nesting, indentation and aliases, in one
//! linear pass, so a small hostile document cannot stall the agent.

/// Deepest flow nesting (`[`/`{`) accepted in a YAML document certrotor reads. A kubeconfig or
/// static-pod manifest nests a handful of levels; the YAML parser's work grows with the square
/// of the nesting, so a deep document under the size limit could stall the agent for hours.
pub const MAX_YAML_FLOW_DEPTH: usize = 32;
/// Widest indentation accepted (block nesting is bounded by it).
pub const MAX_YAML_INDENT: usize = 256;
/// Most block indicators (`- `, `? `) accepted at the start of one line (`- - - x` nests).
pub const MAX_YAML_LINE_INDICATORS: usize = 32;
/// Most alias references (`*name`) accepted: kubeconfigs use none, and expanding aliases is how
/// a small document becomes a huge one.
pub const MAX_YAML_ALIASES: usize = 64;

/// Checks, in one linear pass and before the YAML parser sees it, that a document's nesting is
/// bounded (see the constants above). Overestimates the depth (brackets in plain scalars count),
/// which real kubeconfigs and manifests never come near; never underestimates it: a quote
/// starts a quoted scalar (whose brackets are text) only where YAML starts one, at the start of
/// a node (issue 30.5: an apostrophe inside a plain scalar, `[x 'y, [[[…`, hid every bracket
/// after it, and the parser's quadratic work on deep flow nesting came back). The error says
/// what was found; it never quotes the text.
pub fn check_yaml_shape(text: &str) -> Result<(), String> {
    shape_scan(text).0
}

/// [`check_yaml_shape`], with the number of bytes it examined: each at most once, so its work
/// is linear in the text (a refusal stops early).
pub fn shape_scan(text: &str) -> (Result<(), String>, usize) {
    let mut scan = ShapeScan {
        flow: 0,
        aliases: 0,
        scanned: 0,
        expect_node: true,
    };
    for (n, line) in text.lines().enumerate() {
        if let Err((refusal, at)) = scan.line(n + 1, line.as_bytes()) {
            return (Err(refusal), scan.scanned + at);
        }
        // A line ending inside a quoted scalar: the next line is examined as plain text (the
        // quote's brackets count, an overestimate).
        scan.scanned += line.len() + 1;
    }
    (Ok(()), scan.scanned.min(text.len()))
}

/// A refusal of [`shape_scan`]: what was found, and how far into its line the scan had gone.
type ShapeRefusal = (String, usize);

/// The state [`shape_scan`] carries from line to line.
struct ShapeScan {
    /// Flow nesting depth (open brackets and braces).
    flow: usize,
    aliases: usize,
    /// Bytes examined before the current line.
    scanned: usize,
    /// Where a node may start (so a quote opens a quoted scalar): at the start of a line in
    /// block context, and after an opening bracket or brace, a flow `,`, a `: `, a block
    /// indicator, an anchor or a tag. Inside a flow collection a line continues the previous
    /// one (a plain scalar may go on over several lines, and a quote at its next line's start
    /// is part of it).
    expect_node: bool,
}

fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

impl ShapeScan {
    /// One line (`lineno` counts from 1).
    fn line(&mut self, lineno: usize, bytes: &[u8]) -> Result<(), ShapeRefusal> {
        let indent = bytes.iter().take_while(|&&b| is_blank(b)).count();
        if indent > MAX_YAML_INDENT {
            return Err((
                format!(
                    "line {lineno} is indented {indent} columns, more than the {MAX_YAML_INDENT} \
                     a kubeconfig or manifest ever needs (a hostile or damaged file?)"
                ),
                indent,
            ));
        }
        if self.flow == 0 {
            self.expect_node = true;
        }
        let i = self.block_indicators(lineno, bytes, indent)?;
        self.rest(lineno, bytes, i)
    }

    /// Skips the leading block indicators ("- - - x") from `indent`; where the line's content
    /// starts.
    fn block_indicators(
        &self,
        lineno: usize,
        bytes: &[u8],
        indent: usize,
    ) -> Result<usize, ShapeRefusal> {
        let mut i = indent;
        let mut indicators = 0usize;
        while self.flow == 0
            && i < bytes.len()
            && (bytes[i] == b'-' || bytes[i] == b'?')
            && bytes.get(i + 1).is_none_or(|b| is_blank(*b))
        {
            indicators += 1;
            i += 1;
            while i < bytes.len() && is_blank(bytes[i]) {
                i += 1;
            }
        }
        if indicators > MAX_YAML_LINE_INDICATORS {
            return Err((
                format!(
                    "line {lineno} nests {indicators} block collections, more than the \
                     {MAX_YAML_LINE_INDICATORS} accepted (a hostile or damaged file?)"
                ),
                i,
            ));
        }
        Ok(i)
    }

    /// The line's content from `i`: quotes, brackets, node starts and aliases.
    fn rest(&mut self, lineno: usize, bytes: &[u8], mut j: usize) -> Result<(), ShapeRefusal> {
        let mut quote: Option<u8> = None;
        let mut prev = b' ';
        while j < bytes.len() {
            let b = bytes[j];
            match quote {
                Some(q) => {
                    if b == b'\\' && q == b'"' {
                        j += 1;
                    } else if b == q {
                        quote = None;
                    }
                }
                None if b == b'#' && is_blank(prev) => break,
                None if (b == b'\'' || b == b'"') && self.expect_node => {
                    quote = Some(b);
                    self.expect_node = false;
                }
                None => j = self.plain(lineno, bytes, j, prev)?,
            }
            prev = b;
            j += 1;
        }
        Ok(())
    }

    /// The byte at `j`, outside a quoted scalar and not a comment or a quote that opens one;
    /// where the scan goes on from (the last byte of an anchor's or a tag's name).
    fn plain(
        &mut self,
        lineno: usize,
        bytes: &[u8],
        mut j: usize,
        prev: u8,
    ) -> Result<usize, ShapeRefusal> {
        let b = bytes[j];
        let blank_next = bytes.get(j + 1).is_none_or(|c| is_blank(*c));
        match b {
            b' ' | b'\t' => {}
            b'[' | b'{' => {
                self.flow += 1;
                self.expect_node = true;
                if self.flow > MAX_YAML_FLOW_DEPTH {
                    return Err((
                        format!(
                            "line {lineno} nests brackets more than {MAX_YAML_FLOW_DEPTH} \
                             deep (a hostile or damaged file?)"
                        ),
                        j + 1,
                    ));
                }
            }
            b']' | b'}' => {
                self.flow = self.flow.saturating_sub(1);
                self.expect_node = false;
            }
            b',' if self.flow > 0 => self.expect_node = true,
            b':' if blank_next => self.expect_node = true,
            b'-' | b'?' if self.expect_node && self.flow == 0 && blank_next => {}
            b'&' | b'!' if self.expect_node => {
                // An anchor or a tag: its name, then still the start of a node.
                while j + 1 < bytes.len()
                    && !is_blank(bytes[j + 1])
                    && !(self.flow > 0 && matches!(bytes[j + 1], b',' | b'[' | b']' | b'{' | b'}'))
                {
                    j += 1;
                }
            }
            // Counted wherever an alias may start, and wherever the old check counted
            // one (after a blank or a flow indicator): more is safe, fewer is not.
            b'*' if self.expect_node
                || matches!(prev, b' ' | b'\t' | b'[' | b'{' | b',' | b':') =>
            {
                self.aliases += 1;
                self.expect_node = false;
                if self.aliases > MAX_YAML_ALIASES {
                    return Err((
                        format!(
                            "more than {MAX_YAML_ALIASES} YAML aliases (a hostile or \
                             damaged file?)"
                        ),
                        j + 1,
                    ));
                }
            }
            _ => self.expect_node = false,
        }
        Ok(j)
    }
}
