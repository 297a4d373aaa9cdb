//! Test guest: a valid component for another world (`other:thing/thing`,
//! exporting `process: func(x: u32) -> u32`, importing nothing of
//! stephost's). The host must refuse it with a clear "wrong world" error.

#[allow(unsafe_code)] // generated canonical ABI glue
mod bindings {
    wit_bindgen::generate!({
        inline: "
            package other:thing@1.0.0;

            world thing {
                export process: func(x: u32) -> u32;
            }
        ",
    });

    struct Thing;

    impl Guest for Thing {
        fn process(x: u32) -> u32 {
            x.wrapping_mul(2)
        }
    }

    export!(Thing);
}
