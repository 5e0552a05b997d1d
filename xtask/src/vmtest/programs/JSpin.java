// The vmtest guest's Java program: its thread spin-worker (the name of
// its OS thread too, which roots hostprof's folded stacks) runs, for
// ever while main waits,
//
//   JSpin$Worker.run → handler → hotLoop                          5 parts
//                              → viaJni → nativeCall → Java_JSpin_nativeCall (C)
//                                         → callback → coldLoop   1 part
//
// the JNI path crossing from Java into C and back (a native wrapper, the
// C function, the VM's call stub). The guest runs it with
// -XX:+PrintCompilation and records once C2 has compiled handler, so the
// samples walk compiled frames (and whatever is still interpreted), not
// only the interpreter's. Its argument: the JNI library's path.
//
// Keep the names and the shape stable: the guest's suite (init.sh) looks
// for them.
public class JSpin {
    // Results go here so that the JIT cannot drop the loop.
    static volatile long sink;

    static final class Worker extends Thread {
        Worker() {
            super("spin-worker");
        }

        @Override
        public void run() {
            for (int round = 0; ; round++) {
                handler(round);
            }
        }
    }

    static native void nativeCall(int round);

    static void handler(int round) {
        long total = hotLoop(100_000, round);
        total += viaJni(round);
        sink = total;
    }

    static long viaJni(int round) {
        nativeCall(round);
        return sink;
    }

    // Called back from C (Java_JSpin_nativeCall) through JNI.
    static void callback(int round) {
        sink = coldLoop(20_000, round);
    }

    static long coldLoop(int iterations, int seed) {
        long x = seed;
        for (int i = 0; i < iterations; i++) {
            x = x * 6364136223846793005L + (i ^ (x >>> 29));
        }
        return x;
    }

    static long hotLoop(int iterations, int seed) {
        long x = seed;
        for (int i = 0; i < iterations; i++) {
            x = x * 6364136223846793005L + (i ^ (x >>> 29));
        }
        return x;
    }

    public static void main(String[] args) throws InterruptedException {
        System.load(args[0]);
        Worker worker = new Worker();
        worker.start();
        worker.join();
    }
}
