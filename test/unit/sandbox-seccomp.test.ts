import test from "ava";
import {
  ALWAYS_REFUSED,
  ENOSYS,
  EOPNOTSUPP,
  EPERM,
  REFUSED_WITHOUT_MEMORY_CGROUP,
  refusedSyscalls,
  seccompArchOf,
  seccompProgram,
  type SeccompArch,
} from "../../actors/sandbox-seccomp.js";

const AUDIT_ARCH = { x64: 0xc000003e, arm64: 0xc00000b7, i386: 0x40000003, arm: 0x40000028 };
const ALLOW = 0x7fff0000;
const REFUSE = 0x00050000 | ENOSYS;
const NOT_PERMITTED = 0x00050000 | EPERM;
/** fallocate fails as on a filesystem without it (EOPNOTSUPP is 95 on both architectures). */
const NOT_SUPPORTED = 0x00050000 | EOPNOTSUPP;
const FALLOCATE = { x64: 285, arm64: 47 };
/** ioctl's number, and the requests that preallocate like fallocate (fs/ioctl.c), written out apart from the filter's. */
const IOCTL = { x64: 16, arm64: 29 };
const FS_IOC_RESVSP = 0x40305828;
const FS_IOC_RESVSP64 = 0x4030582a;
const FS_IOC_ZERO_RANGE = 0x40305839;
/** XFS_IOC_ALLOCSP, FREESP, ALLOCSP64, FREESP64: _IOW('X', 10 / 11 / 36 / 37, struct xfs_flock64), preallocating before Linux 5.17. */
const XFS_PREALLOCATING = [0x4030580a, 0x4030580b, 0x40305824, 0x40305825];
/** One past Linux 6.17's last system call (file_setattr, 469), written out apart from the filter's constant. */
const FIRST_UNKNOWN = 470;
/** personality's number on each, and the values Docker's default profile lets it set. */
const PERSONALITY = { x64: 135, arm64: 92 };
const PERSONALITIES = [0x0, 0x8, 0x20000, 0x20008, 0xffffffff];

/**
 * Runs a classic BPF program as the kernel's seccomp does, for the instructions a
 * filter may hold (loads from seccomp_data, conditional jumps with a constant, returns):
 * anything else fails the test, as would a jump out of the program or a fall off its end.
 */
function run(program: Buffer, data: { nr: number; arch: number; arg0?: bigint; arg1?: bigint }): number {
  const arg0 = data.arg0 ?? 0n;
  const arg1 = data.arg1 ?? 0n;
  const count = program.length / 8;
  let a = 0;
  for (let pc = 0, steps = 0; steps <= count; steps++) {
    if (pc >= count) throw new Error(`fell off the program at ${pc}`);
    const code = program.readUInt16LE(pc * 8);
    const jt = program.readUInt8(pc * 8 + 2);
    const jf = program.readUInt8(pc * 8 + 3);
    const k = program.readUInt32LE(pc * 8 + 4);
    switch (code) {
      case 0x20: // BPF_LD | BPF_W | BPF_ABS
        if (k === 0) a = data.nr >>> 0;
        else if (k === 4) a = data.arch >>> 0;
        else if (k === 16) a = Number(arg0 & 0xffffffffn); // args[0]'s low word, little-endian
        else if (k === 20) a = Number((arg0 >> 32n) & 0xffffffffn);
        else if (k === 24) a = Number(arg1 & 0xffffffffn); // args[1]'s low word
        else if (k === 28) a = Number((arg1 >> 32n) & 0xffffffffn);
        else throw new Error(`load from offset ${k}`);
        pc++;
        break;
      case 0x15: // BPF_JMP | BPF_JEQ | BPF_K
        pc += 1 + (a === k ? jt : jf);
        break;
      case 0x35: // BPF_JMP | BPF_JGE | BPF_K
        pc += 1 + (a >= k ? jt : jf);
        break;
      case 0x06: // BPF_RET | BPF_K
        return k;
      default:
        throw new Error(`instruction ${code.toString(16)} at ${pc}`);
    }
  }
  throw new Error("the program loops");
}

const ARCHES: SeccompArch[] = ["x64", "arm64"];

/**
 * The kernel's numbers of the refused calls, copied here from the headers apart from the
 * filter's own table (asm/unistd_64.h; asm-generic/unistd.h for arm64, which has no
 * uselib nor modify_ldt), so a wrong number in either shows.
 */
const KERNEL_NUMBERS: Record<SeccompArch, Record<string, number>> = {
  x64: {
    add_key: 248, request_key: 249, keyctl: 250, bpf: 321, userfaultfd: 323, perf_event_open: 298,
    io_uring_setup: 425, io_uring_enter: 426, io_uring_register: 427, kexec_load: 246, kexec_file_load: 320,
    memfd_secret: 447, uselib: 134, modify_ldt: 154, shmget: 29, msgget: 68, semget: 64, memfd_create: 319,
  },
  arm64: {
    add_key: 217, request_key: 218, keyctl: 219, bpf: 280, userfaultfd: 282, perf_event_open: 241,
    io_uring_setup: 425, io_uring_enter: 426, io_uring_register: 427, kexec_load: 104, kexec_file_load: 294,
    memfd_secret: 447, shmget: 194, msgget: 186, semget: 190, memfd_create: 279,
  },
};
const MEMORY_CALLS = ["shmget", "msgget", "semget", "memfd_create"];

for (const arch of ARCHES) {
  for (const memoryCgroup of [true, false]) {
    test(`sandbox-seccomp - ${arch}, ${memoryCgroup ? "with" : "without"} a memory cgroup: exactly the listed calls of the node's ABI and every call past the last known one are refused, every other ABI whole; personality sets only the values Docker allows; fallocate fails as unsupported`, (t) => {
      const program = seccompProgram(arch, refusedSyscalls(memoryCgroup));
      const numbers = new Set(Object.entries(KERNEL_NUMBERS[arch]).filter(([name]) => !memoryCgroup || !MEMORY_CALLS.includes(name)).map(([, nr]) => nr));
      // Every number a system call has today, and well past it: those past the last known are refused.
      let allowed = 0;
      for (let nr = 0; nr < 2048; nr++) {
        if (nr === PERSONALITY[arch] || nr === IOCTL[arch]) continue;
        const got = run(program, { nr, arch: AUDIT_ARCH[arch] });
        const want = numbers.has(nr) || nr >= FIRST_UNKNOWN ? REFUSE : nr === FALLOCATE[arch] ? NOT_SUPPORTED : ALLOW;
        if (got !== want) t.fail(`nr ${nr}: ${got.toString(16)}`);
        if (got === ALLOW) allowed++;
      }
      t.is(allowed, FIRST_UNKNOWN - 3 - numbers.size);
      // ioctl: the preallocating requests fail as fallocate does (the kernel reads the request's low 32 bits); any other is allowed.
      for (const request of [FS_IOC_RESVSP, FS_IOC_RESVSP64, FS_IOC_ZERO_RANGE, ...XFS_PREALLOCATING]) {
        t.is(run(program, { nr: IOCTL[arch], arch: AUDIT_ARCH[arch], arg1: BigInt(request) }), NOT_SUPPORTED, `ioctl ${request.toString(16)}`);
        t.is(run(program, { nr: IOCTL[arch], arch: AUDIT_ARCH[arch], arg1: (0xdeadn << 32n) | BigInt(request) }), NOT_SUPPORTED, `ioctl high bits ${request.toString(16)}`);
      }
      for (const request of [0, 0x5401 /* TCGETS */, 0x541b /* FIONREAD */, 0x40305829 /* FS_IOC_UNRESVSP */, 0x4030582b /* UNRESVSP64 */, 0x80086601 /* FS_IOC_GETFLAGS */, 0xc020660b /* FS_IOC_FIEMAP */, 0xffffffff]) {
        t.is(run(program, { nr: IOCTL[arch], arch: AUDIT_ARCH[arch], arg1: BigInt(request) }), ALLOW, `ioctl ${request.toString(16)}`);
      }
      t.is(EOPNOTSUPP, 95);
      for (const nr of [0x7fffffff, 0x80000000, 0xfffffffe, 0xffffffff]) t.is(run(program, { nr, arch: AUDIT_ARCH[arch] }), REFUSE, `nr ${nr}`);
      // x32 (x86-64 numbers with bit 30) is another ABI in the same AUDIT_ARCH; refused on arm64 as past the last known.
      for (const nr of [0, 1, 29, 59, 0x1ff, 0x3fffffff]) {
        const got = run(program, { nr: 0x40000000 + nr, arch: AUDIT_ARCH[arch] });
        t.is(got, REFUSE, `x32 nr ${nr}`);
      }
      // personality: the allowed values (only its low 32 bits count: the kernel takes an unsigned int); every flag else is EPERM.
      for (const value of PERSONALITIES) {
        t.is(run(program, { nr: PERSONALITY[arch], arch: AUDIT_ARCH[arch], arg0: BigInt(value) }), ALLOW, `personality ${value.toString(16)}`);
        t.is(run(program, { nr: PERSONALITY[arch], arch: AUDIT_ARCH[arch], arg0: (0xdeadn << 32n) | BigInt(value) }), ALLOW, `personality high bits ${value.toString(16)}`);
      }
      const flags = [0x0040000 /* ADDR_NO_RANDOMIZE */, 0x0100000 /* MMAP_PAGE_ZERO */, 0x0400000 /* READ_IMPLIES_EXEC */, 0x0800000, 0x1000000, 0x2000000, 0x4000000, 0x8000000];
      for (const value of [...flags, ...flags.map((flag) => flag | 0x8), 0x1, 0x7, 0x9, 0xfffffffe, 0x10000]) {
        t.is(run(program, { nr: PERSONALITY[arch], arch: AUDIT_ARCH[arch], arg0: BigInt(value) }), NOT_PERMITTED, `personality ${value.toString(16)}`);
      }
      for (const other of [AUDIT_ARCH.i386, AUDIT_ARCH.arm, AUDIT_ARCH[arch === "x64" ? "arm64" : "x64"], 0]) {
        for (const nr of [0, 1, 3, 117, 29, 194]) t.is(run(program, { nr, arch: other }), REFUSE, `arch ${other.toString(16)} nr ${nr}`);
      }
      t.is(program.length % 8, 0);
    });
  }
}

test("sandbox-seccomp - the lists: memory outside the rlimits only without a memory cgroup, attack surface always; a duplicate number is one instruction; a call the architecture lacks is none", (t) => {
  t.deepEqual(refusedSyscalls(true), [...ALWAYS_REFUSED]);
  t.deepEqual(refusedSyscalls(false), [...ALWAYS_REFUSED, ...REFUSED_WITHOUT_MEMORY_CGROUP]);
  for (const name of MEMORY_CALLS) {
    t.true(refusedSyscalls(false).some((refused) => refused === name));
    t.false(refusedSyscalls(true).some((refused) => refused === name));
  }
  // io_uring's calls have the same numbers on both: listed twice, compiled once.
  const once = seccompProgram("arm64", ["io_uring_setup"]);
  t.is(seccompProgram("arm64", ["io_uring_setup", "io_uring_setup"]).length, once.length);
  t.is(run(once, { nr: 425, arch: AUDIT_ARCH.arm64 }), REFUSE);
  t.is(run(once, { nr: 426, arch: AUDIT_ARCH.arm64 }), ALLOW);
  // Past the last known call even with nothing listed.
  t.is(run(seccompProgram("x64", []), { nr: 470, arch: AUDIT_ARCH.x64 }), REFUSE);
  t.is(run(seccompProgram("x64", []), { nr: 469, arch: AUDIT_ARCH.x64 }), ALLOW);
  // uselib is x86-64's only: on arm64 its x86-64 number (134, rt_sigreturn there) stays allowed.
  t.is(seccompProgram("arm64", ["uselib", "modify_ldt"]).length, seccompProgram("arm64", []).length);
  t.is(run(seccompProgram("arm64", ["uselib"]), { nr: 134, arch: AUDIT_ARCH.arm64 }), ALLOW);
});

test("sandbox-seccomp - a filter is built for x86-64 and arm64 only", (t) => {
  t.is(seccompArchOf("x64"), "x64");
  t.is(seccompArchOf("arm64"), "arm64");
  for (const other of ["ia32", "arm", "riscv64", "ppc64", "s390x", "loong64"]) t.is(seccompArchOf(other), undefined);
});
