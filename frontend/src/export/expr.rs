//! Size expressions of the serialized program: sympy's `srepr` spelling
//! (`Add(Symbol('s70', positive=True, integer=True), Integer(1))`) and the plain one (`s70 + 1`,
//! `2*s70`), parsed into minductor's [`SizeExpr`] polynomials.
//!
//! Supported: integers, symbols, `+`, `-`, `*`, `**` with a non-negative integer exponent,
//! `Add`, `Mul`, `Pow`, and `FloorDiv`/`//` by an integer that divides the polynomial exactly.
//! Anything else (`Mod`, `Max`, a division that does not divide) is an error naming the
//! expression: the importer cannot represent it as a dim.

use minductor_ir::{SizeExpr, SymId};

/// Parses `text`, naming symbols through `symbol` (which allocates a [`SymId`] per name).
pub fn parse(text: &str, symbol: &mut dyn FnMut(&str) -> SymId) -> Result<SizeExpr, String> {
    let tokens = tokenize(text)?;
    let mut parser = Parser {
        tokens,
        at: 0,
        symbol,
    };
    let e = parser.expr()?;
    if parser.at != parser.tokens.len() {
        return Err(format!("unexpected `{:?}`", parser.tokens[parser.at]));
    }
    match e {
        Item::Size(e) => Ok(e),
        other => Err(format!("not a size: {other:?}")),
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Int(i64),
    Name(String),
    Str(String),
    Punct(&'static str),
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let s: String = chars[start..i].iter().collect();
            out.push(Token::Int(
                s.parse().map_err(|_| format!("integer `{s}` too large"))?,
            ));
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token::Name(chars[start..i].iter().collect()));
        } else if c == '\'' || c == '"' {
            let start = i + 1;
            i += 1;
            while i < chars.len() && chars[i] != c {
                i += 1;
            }
            if i >= chars.len() {
                return Err("unterminated string".into());
            }
            out.push(Token::Str(chars[start..i].iter().collect()));
            i += 1;
        } else {
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            let punct = match two.as_str() {
                "**" => Some("**"),
                "//" => Some("//"),
                _ => None,
            };
            if let Some(p) = punct {
                out.push(Token::Punct(p));
                i += 2;
                continue;
            }
            let p = match c {
                '(' => "(",
                ')' => ")",
                ',' => ",",
                '+' => "+",
                '-' => "-",
                '*' => "*",
                '=' => "=",
                _ => return Err(format!("unexpected character `{c}`")),
            };
            out.push(Token::Punct(p));
            i += 1;
        }
    }
    Ok(out)
}

#[derive(Debug)]
enum Item {
    Size(SizeExpr),
    /// A keyword argument or a string (`positive=True`, `'s0'`): only meaningful inside a call.
    Other(String),
}

struct Parser<'a> {
    tokens: Vec<Token>,
    at: usize,
    symbol: &'a mut dyn FnMut(&str) -> SymId,
}

fn size(item: Item) -> Result<SizeExpr, String> {
    match item {
        Item::Size(e) => Ok(e),
        Item::Other(s) => Err(format!("`{s}` is not a size")),
    }
}

fn power(base: &SizeExpr, exponent: &SizeExpr) -> Result<SizeExpr, String> {
    let Some(k) = exponent.as_const().filter(|&k| (0..=16).contains(&k)) else {
        return Err(format!(
            "exponent `{exponent}` is not a small non-negative integer"
        ));
    };
    let mut out = SizeExpr::Const(1);
    for _ in 0..k {
        out = out.times(base);
    }
    Ok(out)
}

fn floor_div(a: &SizeExpr, b: &SizeExpr) -> Result<SizeExpr, String> {
    let Some(k) = b.as_const().filter(|&k| k > 0) else {
        return Err(format!(
            "division by `{b}`, which is not a positive integer"
        ));
    };
    if let Some(c) = a.as_const() {
        return Ok(SizeExpr::Const(c.div_euclid(k)));
    }
    a.divide_exactly(k)
        .ok_or_else(|| format!("`{a}` is not a multiple of {k} for every size"))
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn eat(&mut self, p: &str) -> bool {
        if self.peek()
            == Some(&Token::Punct(match p {
                "(" => "(",
                ")" => ")",
                "," => ",",
                "+" => "+",
                "-" => "-",
                "*" => "*",
                "**" => "**",
                "//" => "//",
                "=" => "=",
                _ => return false,
            }))
        {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn expr(&mut self) -> Result<Item, String> {
        let first = self.term()?;
        if !matches!(
            self.peek(),
            Some(Token::Punct("+")) | Some(Token::Punct("-"))
        ) {
            return Ok(first);
        }
        let mut acc = size(first)?;
        loop {
            if self.eat("+") {
                acc = acc.plus(&size(self.term()?)?);
            } else if self.eat("-") {
                acc = acc.plus(&size(self.term()?)?.scale(-1));
            } else {
                return Ok(Item::Size(acc));
            }
        }
    }

    fn term(&mut self) -> Result<Item, String> {
        let first = self.factor()?;
        if !matches!(
            self.peek(),
            Some(Token::Punct("*")) | Some(Token::Punct("//"))
        ) {
            return Ok(first);
        }
        let mut acc = size(first)?;
        loop {
            if self.eat("*") {
                acc = acc.times(&size(self.factor()?)?);
            } else if self.eat("//") {
                acc = floor_div(&acc, &size(self.factor()?)?)?;
            } else {
                return Ok(Item::Size(acc));
            }
        }
    }

    fn factor(&mut self) -> Result<Item, String> {
        if self.eat("-") {
            return Ok(Item::Size(size(self.factor()?)?.scale(-1)));
        }
        let base = self.atom()?;
        if self.eat("**") {
            let exponent = size(self.factor()?)?;
            return Ok(Item::Size(power(&size(base)?, &exponent)?));
        }
        Ok(base)
    }

    fn atom(&mut self) -> Result<Item, String> {
        let Some(token) = self.peek().cloned() else {
            return Err("unexpected end".into());
        };
        self.at += 1;
        match token {
            Token::Int(n) => Ok(Item::Size(SizeExpr::Const(n))),
            Token::Str(s) => Ok(Item::Other(s)),
            Token::Punct("(") => {
                let e = self.expr()?;
                if !self.eat(")") {
                    return Err("missing `)`".into());
                }
                Ok(e)
            }
            Token::Punct(p) => Err(format!("unexpected `{p}`")),
            Token::Name(name) => {
                if self.eat("=") {
                    // A keyword argument (`positive=True`): its value is read and dropped.
                    let _ = self.expr()?;
                    return Ok(Item::Other(name));
                }
                if !self.eat("(") {
                    return match name.as_str() {
                        "True" | "False" => Ok(Item::Other(name)),
                        _ => Ok(Item::Size(SizeExpr::symbol((self.symbol)(&name)))),
                    };
                }
                let mut args = Vec::new();
                if !self.eat(")") {
                    loop {
                        args.push(self.expr()?);
                        if self.eat(")") {
                            break;
                        }
                        if !self.eat(",") {
                            return Err(format!("expected `,` or `)` in `{name}(..)`"));
                        }
                    }
                }
                self.call(&name, args)
            }
        }
    }

    fn call(&mut self, name: &str, args: Vec<Item>) -> Result<Item, String> {
        let sizes = |args: Vec<Item>| -> Result<Vec<SizeExpr>, String> {
            args.into_iter()
                .filter(|a| !matches!(a, Item::Other(_)))
                .map(size)
                .collect()
        };
        match name {
            "Symbol" => match args.first() {
                Some(Item::Other(s)) => Ok(Item::Size(SizeExpr::symbol((self.symbol)(s)))),
                _ => Err("Symbol(..) without a name".into()),
            },
            "Integer" => {
                let v = sizes(args)?;
                match v.as_slice() {
                    [e] if e.as_const().is_some() => Ok(Item::Size(e.clone())),
                    _ => Err("Integer(..) of a non-integer".into()),
                }
            }
            "Add" => Ok(Item::Size(
                sizes(args)?
                    .iter()
                    .fold(SizeExpr::Const(0), |a, b| a.plus(b)),
            )),
            "Mul" => Ok(Item::Size(
                sizes(args)?
                    .iter()
                    .fold(SizeExpr::Const(1), |a, b| a.times(b)),
            )),
            "Pow" => match sizes(args)?.as_slice() {
                [b, e] => Ok(Item::Size(power(b, e)?)),
                _ => Err("Pow takes two arguments".into()),
            },
            "FloorDiv" | "CleanDiv" => match sizes(args)?.as_slice() {
                [a, b] => Ok(Item::Size(floor_div(a, b)?)),
                _ => Err(format!("{name} takes two arguments")),
            },
            other => Err(format!("`{other}` is not supported in a size")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_with(text: &str) -> Result<String, String> {
        let mut names: Vec<String> = Vec::new();
        let mut symbol = |n: &str| {
            let i = names.iter().position(|m| m == n).unwrap_or_else(|| {
                names.push(n.to_string());
                names.len() - 1
            });
            SymId(i as u32)
        };
        parse(text, &mut symbol).map(|e| e.to_string())
    }

    #[test]
    fn srepr_and_plain_spellings_agree() {
        let a = parse_with("Add(Symbol('s70', positive=True, integer=True), Integer(1))");
        let b = parse_with("s70 + 1");
        assert_eq!(a, b);
        let c = parse_with("Mul(Integer(2), Symbol('s70', positive=True, integer=True))");
        assert_eq!(c, parse_with("2*s70"));
        assert_eq!(parse_with("Integer(-3)"), Ok("-3".to_string()));
        assert_eq!(parse_with("FloorDiv(2*s0, 2)"), parse_with("s0"));
        assert!(parse_with("Mod(s0, 3)").is_err());
        assert!(parse_with("FloorDiv(s0, 2)").is_err());
    }
}
