//! Shared load-generator machinery for echotest and rpctest (being implemented).
