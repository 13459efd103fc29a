//! The `error` a side sends when it refuses a connection (spec §6.5, §11.3).

use handoff_wire::framing::encode_header_into;
use handoff_wire::{Header, Preamble, WireError};

/// The longest explanation an `error` carries (spec §6.5): it may quote what the peer sent.
pub const MAX_ERROR_TEXT: usize = 1024;

/// `text` cut to at most [`MAX_ERROR_TEXT`] bytes, on a character boundary, with a mark.
pub fn clipped(text: String) -> String {
    if text.len() <= MAX_ERROR_TEXT {
        return text;
    }
    let mut keep = MAX_ERROR_TEXT - 32;
    while !text.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{} … ({} more bytes)", &text[..keep], text.len() - keep)
}

/// The framed `error` header (length prefix included) that tells a peer why we close.
pub fn error_header(err: &WireError) -> Vec<u8> {
    let mut out = Vec::new();
    encode_header_into(
        &Header::Error {
            code: err.code().to_string(),
            message: clipped(err.to_string()),
        },
        &mut out,
    );
    out
}

/// What a node says to a connection it cannot take at all (spec §9.1, §12): its
/// `preamble`, and, once the peer's whole preamble arrived (an error goes only to a peer
/// that showed it speaks the format, §3, §11.3), `error {code: "overloaded", message: why}`,
/// readable by every version; both framed as they go on the wire.
pub fn overloaded(preamble: Preamble, why: String) -> (Vec<u8>, Vec<u8>) {
    (preamble.encode().to_vec(), error_header(&WireError::Overloaded(why)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overloaded_node_says_its_preamble_then_overloaded() {
        let (ours, error) = overloaded(Preamble::OURS, "full".into());
        assert_eq!(ours, Preamble::OURS.encode());
        let header = Header::decode(&error[4..], &handoff_wire::Limits::DEFAULT).unwrap();
        assert!(matches!(header, Header::Error { code, message } if code == "overloaded" && message.contains("full")));
    }

    #[test]
    fn long_explanations_are_clipped_on_a_character_boundary() {
        assert_eq!(clipped("short".into()), "short");
        let long = "é".repeat(2000);
        let c = clipped(long);
        assert!(c.len() <= MAX_ERROR_TEXT, "{}", c.len());
        assert!(c.ends_with("more bytes)"));
    }
}
