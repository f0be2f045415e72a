//! Errors that are one message: what failed and what to do, already said in full.

/// Declares `pub struct $name(pub String)` with the derives given, `Display` writing the
/// message as it is, and `std::error::Error`.
macro_rules! message_error {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        pub struct $name(pub String);

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::error::Error for $name {}
    };
}

pub(crate) use message_error;

#[cfg(test)]
mod tests {
    message_error!(
        /// A test error.
        #[derive(Debug, Clone, PartialEq, Eq)]
        Oops
    );

    #[test]
    fn the_message_is_displayed_as_it_is() {
        let e: Box<dyn std::error::Error> = Box::new(Oops("disk full: free space".into()));
        assert_eq!(e.to_string(), "disk full: free space");
        assert_eq!(Oops("a".into()), Oops("a".into()));
    }
}
