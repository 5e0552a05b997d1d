// Reads the JFR recording of the vmtest guest's Java program (JSpin) and
// prints what the guest's suite compares hostprof's samples with:
// `truth_worker=N truth_hot=M`, the execution samples of the thread
// spin-worker between two instants (seconds since the epoch, both
// included: hostprof's window) and those whose Java leaf is
// JSpin.hotLoop. The guest's JREs carry no `jfr` tool, but their class
// library reads recordings.
import java.nio.file.Paths;
import java.util.List;
import jdk.jfr.consumer.RecordedEvent;
import jdk.jfr.consumer.RecordedFrame;
import jdk.jfr.consumer.RecordedStackTrace;
import jdk.jfr.consumer.RecordedThread;
import jdk.jfr.consumer.RecordingFile;

public class JfrShare {
    public static void main(String[] args) throws Exception {
        long from = Long.parseLong(args[1]);
        long to = Long.parseLong(args[2]);
        long worker = 0;
        long hot = 0;
        for (RecordedEvent event : RecordingFile.readAllEvents(Paths.get(args[0]))) {
            if (!event.getEventType().getName().equals("jdk.ExecutionSample")) {
                continue;
            }
            long at = event.getStartTime().getEpochSecond();
            if (at < from || at > to) {
                continue;
            }
            RecordedThread thread = event.getThread("sampledThread");
            if (thread == null || !"spin-worker".equals(thread.getJavaName())) {
                continue;
            }
            worker++;
            RecordedStackTrace stack = event.getStackTrace();
            List<RecordedFrame> frames = stack == null ? List.of() : stack.getFrames();
            if (!frames.isEmpty()
                    && frames.get(0).getMethod().getType().getName().equals("JSpin")
                    && frames.get(0).getMethod().getName().equals("hotLoop")) {
                hot++;
            }
        }
        System.out.println("truth_worker=" + worker + " truth_hot=" + hot);
    }
}
