// The vmtest guest's Java program: its thread spin-worker (the name of
// its OS thread too, which roots hostprof's folded stacks) runs
// `JSpin$Worker.run → handler → hotLoop` for ever while main waits. The
// guest runs it with -XX:+PrintCompilation and records once C2 has
// compiled hotLoop, so the samples walk compiled frames (and whatever is
// still interpreted), not only the interpreter's.
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

    static void handler(int round) {
        sink = hotLoop(100_000, round);
    }

    static long hotLoop(int iterations, int seed) {
        long x = seed;
        for (int i = 0; i < iterations; i++) {
            x = x * 6364136223846793005L + (i ^ (x >>> 29));
        }
        return x;
    }

    public static void main(String[] args) throws InterruptedException {
        Worker worker = new Worker();
        worker.start();
        worker.join();
    }
}
