//! What a case concludes: passed, a deliberate departure, failed, or not run
//! (each with its reason). Its own module so that the case lists and the API
//! cases both use it without depending on each other.

pub enum Outcome {
    Pass(String),
    Depart(String),
    Fail(String),
    NotRun(String),
}
