module go_labels

go 1.19
