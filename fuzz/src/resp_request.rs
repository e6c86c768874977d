//! The `resp_request` target: bytes from a Redis client, as the RESP port reads them.

/// The RESP port's request limits in the checks: small, so that inputs reach them.
const RESP_LIMITS: existence_gate::service::resp::RequestLimits =
    existence_gate::service::resp::RequestLimits {
        max_args: 16,
        max_arg_bytes: 64,
        max_inline_bytes: 128,
        unauthenticated: false,
    };

/// The RESP request reader on arbitrary bytes, as a connection reads them: each command taken is within the
/// limits and consumed its bytes; an array command written back out reads back the same; a prefix of the
/// input yields a prefix of its commands (bytes arriving in two reads change nothing).
pub fn resp_request(data: &[u8]) {
    use existence_gate::service::resp::request::take_command;
    let read_all = |bytes: &[u8]| {
        let mut buffer = bytes::BytesMut::from(bytes);
        let mut commands = Vec::new();
        while let Ok(Some(command)) = take_command(&mut buffer, &RESP_LIMITS) {
            assert!(command.len() <= RESP_LIMITS.max_args);
            commands.push(command);
            if commands.len() > bytes.len() {
                panic!("more commands than bytes: the reader consumed nothing");
            }
        }
        commands
    };
    let commands = read_all(data);
    for command in &commands {
        let mut encoded = format!("*{}\r\n", command.len()).into_bytes();
        for arg in command {
            assert!(arg.len() <= RESP_LIMITS.max_arg_bytes);
            encoded.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            encoded.extend_from_slice(arg);
            encoded.extend_from_slice(b"\r\n");
        }
        let mut buffer = bytes::BytesMut::from(&encoded[..]);
        let again = take_command(&mut buffer, &RESP_LIMITS).expect("a written command reads back");
        assert_eq!(again.as_ref(), Some(command));
    }
    let half = read_all(&data[..data.len() / 2]);
    assert!(half.len() <= commands.len());
    assert_eq!(&commands[..half.len()], &half[..]);
}
