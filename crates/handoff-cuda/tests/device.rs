//! The driver on a machine with a CUDA device (`scripts/gpu-check` runs this binary on a
//! lent one). Without a device each test says why and checks only that nothing panics.

use handoff_cuda::{driver, OpenError};

/// The driver, or `None` after saying why these checks do not apply here.
fn gpu() -> Option<&'static handoff_cuda::Driver> {
    match driver() {
        Ok(d) => Some(d),
        Err(why) => {
            eprintln!("skipped: {why}");
            None
        }
    }
}

#[test]
fn bytes_go_to_the_device_and_back() {
    let Some(d) = gpu() else { return };
    let data: Vec<u8> = (0..(4 << 20)).map(|i| (i % 251) as u8).collect();
    let on_device = d.upload(0, &data).expect("upload");
    assert_eq!(on_device.len(), data.len() as u64);
    let mut back = vec![0u8; data.len()];
    d.copy_to_host(on_device.ptr(), &mut back).expect("copy back");
    assert_eq!(back, data);
    // A range inside the allocation.
    let mut part = vec![0u8; 1000];
    d.copy_to_host(on_device.ptr() + 12_345, &mut part)
        .expect("copy a range");
    assert_eq!(part, data[12_345..13_345]);
}

#[test]
fn a_range_is_named_by_its_allocation_and_offset() {
    let Some(d) = gpu() else { return };
    let alloc = d.alloc(0, 1 << 20).expect("alloc");
    let exported = d.export(alloc.ptr() + 4096, 8192).expect("export");
    assert_eq!(exported.offset, 4096);
    assert_eq!(exported.device, d.uuid(0));
    // Past the allocation: refused, not read.
    assert!(d.export(alloc.ptr() + 4096, 1 << 20).is_err());
    // A process cannot open its own handle (the driver refuses): an error, no panic.
    match d.open(&exported.ipc, &exported.device, 0, 16) {
        Err(OpenError::Driver(e)) => eprintln!("own handle refused as expected: {e}"),
        Err(other) => panic!("unexpected refusal: {other}"),
        Ok(_) => eprintln!("this driver opened a handle of its own process"),
    }
    // A device this process does not see.
    assert_eq!(
        d.open(&exported.ipc, &[0xee; 16], 0, 16).err(),
        Some(OpenError::NoSuchDevice)
    );
}

#[test]
fn free_memory_is_reported() {
    let Some(d) = gpu() else { return };
    let (free, total) = d.memory_info(0).expect("memory info");
    assert!(free > 0 && free <= total);
}
