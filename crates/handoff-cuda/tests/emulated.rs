//! The emulated driver (`HANDOFF_CUDA_EMULATE=1`) that tests of handoff's GPU path run on
//! machines without a GPU: it must keep the driver's contracts that handoff relies on.

use handoff_cuda::{driver, OpenError};

/// The emulated driver: every test of this binary asks for it before anything loads one.
fn emulated() -> &'static handoff_cuda::Driver {
    // SAFETY (edition 2021: a plain call): set before any thread reads the environment's
    // copy that matters, the driver's first load, which every test here starts with.
    std::env::set_var("HANDOFF_CUDA_EMULATE", "1");
    let d = driver().expect("the emulated driver loads everywhere");
    assert!(d.is_emulated());
    d
}

#[test]
fn an_exported_range_opens_as_the_same_bytes_and_goes_with_its_last_frame() {
    let d = emulated();
    let data: Vec<u8> = (0..(1 << 20)).map(|i| (i % 251) as u8).collect();
    let alloc = d.upload(0, &data).expect("upload");
    let (free_before, _) = d.memory_info(0).unwrap();
    let exported = d.export(alloc.ptr() + 1000, 5000).expect("export");
    assert_eq!(exported.offset, 1000);
    let opened = d.open(&exported.ipc, &exported.device, 1000, 5000).expect("open");
    let again = d
        .open(&exported.ipc, &exported.device, 0, 10)
        .expect("a second frame of it");
    let mut out = vec![0u8; 5000];
    d.copy_to_host(opened.ptr(), &mut out).unwrap();
    assert_eq!(out, data[1000..6000]);
    let (free_mapped, _) = d.memory_info(0).unwrap();
    assert_eq!(free_before - free_mapped, 1 << 20, "one mapping for both frames");
    drop(opened);
    drop(again);
    assert_eq!(d.memory_info(0).unwrap().0, free_before, "unmapped with the last frame");
    drop(alloc);
}

#[test]
fn what_is_not_emulated_memory_is_refused_not_read() {
    let d = emulated();
    let mut out = [0u8; 16];
    assert!(d.copy_to_host(0xdead_0000, &mut out).is_err());
    assert!(d.export(0xdead_0000, 16).is_err());
    let alloc = d.alloc(0, 4096).unwrap();
    assert!(d.export(alloc.ptr(), 8192).is_err(), "past the allocation");
    assert!(matches!(
        d.open(&[0u8; 64], &d.uuid(0), 0, 16),
        Err(OpenError::Driver(_))
    ));
    let exported = d.export(alloc.ptr(), 4096).unwrap();
    assert!(matches!(
        d.open(&exported.ipc, &exported.device, 4000, 200),
        Err(OpenError::OutOfRange { .. })
    ));
}
