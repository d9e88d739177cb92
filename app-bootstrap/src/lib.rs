//! Placeholder: being built (see the open issue).
